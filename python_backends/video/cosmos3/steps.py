"""Cosmos3 text to video: the pre, text encoder and VAE decode steps, after diffusers'
`Cosmos3OmniPipeline` (the denoise step: denoise.py; the transformer's two pathways: model.py).

pre           the shared video pre step; each prompt as the pipeline's `tokenize_prompt` makes it: the
              clip's duration, fps and resolution sentences appended (their "not" forms to the negative
              prompt), the system prompt and the chat template, then EOS and `<|vision_start|>`. The
              pipeline never truncates, so a prompt over `max_sequence_length` tokens is refused. CFG
              for guidance_scale != 1 (the pipeline's rule). One frame is an image, as the pipeline's
              (the image templates).
text encoder  the transformer's understanding pathway over each row's ids (causal: padding after a row
              changes nothing), every layer's text keys and values out, once per request (the pipeline
              recomputes them at every step and branch; they never change).
VAE decode    AutoencoderKLWan (the Wan2.2 VAE): latents / (1 / std) + mean, in the VAE's dtype as the
              pipeline computes them, the whole clip.
"""
from __future__ import annotations

import numpy as np
import torch

from triton_omni.diffusion.checkpoint import load_component, model_index, pipeline_folder
from triton_omni.diffusion.text_encoder import PromptEncoderStep
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import StepContext, register
from triton_omni.video.cosmos3.model import keep_half, text_kv
from triton_omni.video.pre import VideoPre
from triton_omni.video.request import VideoRequest
from triton_omni.video.vae import VaeDecodeStep
from triton_omni.video.wan_vae import WanVae, wan_vae_layout

# the pipeline's system prompts and metadata sentences (Cosmos3OmniPipeline.__init__), verbatim
SYSTEM_IMAGE = "You are a helpful assistant who will generate images from a give prompt."
SYSTEM_VIDEO = "You are a helpful assistant who will generate videos from a give prompt."
DURATION = "The video is {duration:.1f} seconds long and is of {fps:.0f} FPS."
NOT_DURATION = "The video is not {duration:.1f} seconds long and is not of {fps:.0f} FPS."
RESOLUTION = {False: "This video is of {height}x{width} resolution.", True: "This image is of {height}x{width} resolution."}
NOT_RESOLUTION = {False: "This video is not of {height}x{width} resolution.",
                  True: "This image is not of {height}x{width} resolution."}


def with_metadata(text: str, r: VideoRequest, negative: bool) -> str:
    """The pipeline's `_apply_templates` (both templates on, its defaults)."""
    def append(base: str, addition: str) -> str:
        base = base.rstrip(".")
        return f"{base}. {addition}" if base else addition

    image = r.num_frames == 1
    if not image:
        text = append(text, (NOT_DURATION if negative else DURATION).format(duration=r.num_frames / r.fps, fps=r.fps))
    return append(text, (NOT_RESOLUTION if negative else RESOLUTION)[image].format(height=r.height, width=r.width))


def cosmos3_geometry(folder) -> tuple[int, int, int]:
    """(pixels a side is a multiple of: the VAE's spatial factor, as the pipeline checks (the transformer
    pads odd latent sides to its patch), frames per latent frame after the first, experts)."""
    _, spatial, temporal = wan_vae_layout(folder)
    return spatial, temporal, 1


@register("cosmos3_pre")
class Cosmos3Pre(VideoPre):
    def __init__(self, ctx: StepContext):
        from transformers import AutoTokenizer

        self.folder = pipeline_folder(ctx, ctx.params.checkpoint)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.folder / "text_tokenizer"), local_files_only=True)
        self.system_prompt = bool(model_index(self.folder).get("default_use_system_prompt", True))
        self.suffix = [self.tokenizer.eos_token_id, self.tokenizer.convert_tokens_to_ids("<|vision_start|>")]
        super().__init__(ctx)

    def geometry(self) -> tuple[int, int, int]:
        return cosmos3_geometry(self.folder)

    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale != 1.0         # the pipeline's do_classifier_free_guidance

    def prompts(self, r: VideoRequest) -> list[str]:
        texts = [with_metadata(r.prompt, r, False)]
        if self.uses_cfg(r.guidance_scale):
            texts.append(with_metadata(r.negative_prompt, r, True))
        # read by tokenize (a step instance runs one request at a time)
        self.system = SYSTEM_IMAGE if r.num_frames == 1 else SYSTEM_VIDEO
        return texts

    def tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        rows = []
        for i, text in enumerate(texts):
            turns = [{"role": "system", "content": self.system}] if self.system_prompt else []
            ids = self.tokenizer.apply_chat_template(turns + [{"role": "user", "content": text}], tokenize=True,
                                                     add_generation_prompt=True, add_vision_id=False,
                                                     return_dict=True)["input_ids"]
            rows.append(list(ids) + self.suffix)
            if len(rows[-1]) > self.params.max_sequence_length:
                raise InvalidInput("negative_prompt" if i else "prompt",
                                   f"{len(rows[-1])} tokens with the model's template; at most "
                                   f"{self.params.max_sequence_length} are served")
        ids = np.zeros((len(rows), self.params.max_sequence_length), np.int32)
        mask = np.zeros_like(ids)
        for r, row in enumerate(rows):
            ids[r, :len(row)], mask[r, :len(row)] = row, 1
        return ids, mask


@register("cosmos3_text_encoder")
class Cosmos3TextEncoder(PromptEncoderStep):
    def load_encoder(self) -> torch.nn.Module:
        transformer = load_component(self.folder, "transformer", self.params.dtype, self.device)
        keep_half(transformer, "text")
        transformer.get_input_embeddings = lambda: transformer.embed_tokens
        return transformer

    def check(self, ids: np.ndarray, mask: np.ndarray) -> None:
        lengths = mask.sum(axis=1)
        if (mask != (np.arange(mask.shape[1]) < lengths[:, None])).any() or not lengths.all():
            raise InvalidInput("text_mask", "each row must hold its tokens first, then padding (1s, then 0s)")

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> list[torch.Tensor]:
        lengths = (mask > 0).sum(axis=1)
        keep = int(lengths.max())
        ids_t = torch.from_numpy(ids[:, :keep].astype(np.int64)).to(self.device)
        return text_kv(self.text_encoder, ids_t, [int(n) for n in lengths])


@register("cosmos3_vae_decode")
class Cosmos3VaeDecode(WanVae, VaeDecodeStep):
    def to_vae_space(self, latents: torch.Tensor) -> torch.Tensor:
        # the pipeline's stats: tensors in the VAE's dtype, then 1 / std in that dtype
        dtype, c = self.vae.dtype, self.vae.config.z_dim
        mean = torch.tensor(self.vae.config.latents_mean, dtype=dtype).to(latents.device).view(1, c, 1, 1, 1)
        inv_std = (1.0 / torch.tensor(self.vae.config.latents_std, dtype=dtype)).to(latents.device).view(1, c, 1, 1, 1)
        return latents.to(dtype) / inv_std + mean
