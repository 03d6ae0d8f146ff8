"""What the image-edit models (Qwen-Image-Edit, JoyAI-Image-Edit) share: a Qwen-VL text encoder step
with the input image in the prompt, a one-frame decode of a video VAE with per-channel latent
statistics, and the reference pipelines' processor for the tests.

Both pipelines condition on the input image twice: as vision tokens in the text encoder's prompt, and
as VAE latents beside the noise; the pieces that differ (templates, image sizes, the denoiser) stay in
each model's family.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.image.checkpoint import load_component, pipeline_folder
from triton_omni.image.tensors import to_output
from triton_omni.image.vae import VaeDecodeStep
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext

# Tokens that would make the text encoder look for image or video features the request does not have.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
IMAGE_PAD = "<|image_pad|>"       # one per merged patch of the image processor's grid
# What the pre steps hand the VAE encode step: the resized input images' bytes and sizes.
CONDITION_INPUTS = (
    TensorSpec("condition_pixels", "TYPE_UINT8", (-1,), ragged=True),     # each image's H * W * 3 bytes, in turn
    TensorSpec("condition_sizes", "TYPE_INT32", (-1, 2), ragged=True),    # [images, (height, width)]
)


@dataclass
class EditModelParams:
    checkpoint: str = ""
    dtype: str = "float32"


def host(value) -> np.ndarray:
    """A small step input as a host array (a GPU step may be handed it as a GPU tensor)."""
    return value.cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def latent_stats(vae, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's per-channel latents_mean and latents_std, shaped [1, C, 1, 1]."""
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1).to(device, dtype)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1).to(device, dtype)
    return mean, std


def processor_from_parts(folder, processor_class: str = "Qwen2VLProcessor"):
    """The reference pipeline's processor (transformers' `processor_class`: Qwen2VLProcessor for
    Qwen-Image-Edit, Qwen3VLProcessor for JoyImage-Edit) from processor/'s image processor and tokenizer.
    `from_pretrained` also loads a video processor, which needs torchvision; the edit pipelines never
    pass videos, so the processor is built without one (its constructor's class check would reject the
    missing video processor, hence the subclass). Our steps do not use it."""
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer

    class ImageOnlyProcessor(getattr(transformers, processor_class)):
        def check_argument_for_proper_class(self, name, arg):
            if name == "video_processor" and arg is None:
                return None
            return super().check_argument_for_proper_class(name, arg)

    path = str(folder / "processor")
    return ImageOnlyProcessor(image_processor=AutoImageProcessor.from_pretrained(path, local_files_only=True),
                              tokenizer=AutoTokenizer.from_pretrained(path, local_files_only=True),
                              video_processor=None)


# -- text encoder --------------------------------------------------------------------------------------
@dataclass
class EditTextEncoderParams(EditModelParams):
    drop_tokens: int = 0         # the pipeline's prompt_template_encode_start_idx: the system prompt's tokens


class EditTextEncoder(Step):
    """A Qwen-VL text encoder with the request's images in the prompt. Every row of every request
    (prompt, negative) goes in one padded call; a model says which hidden states are its embeddings
    (`hidden_states`) and how many leading tokens to drop (`Params.drop_tokens`)."""
    inputs = (
        TensorSpec("text_ids", "TYPE_INT32", (-1, -1), ragged=True),
        TensorSpec("text_mask", "TYPE_INT32", (-1, -1), ragged=True),
        TensorSpec("pixel_values", "TYPE_FP32", (-1, -1), ragged=True),
        TensorSpec("image_grid_thw", "TYPE_INT64", (-1, 3), ragged=True),
    )
    outputs = (
        TensorSpec("prompt_embeds", "TYPE_FP32", (-1, -1)),
        TensorSpec("negative_embeds", "TYPE_FP32", (-1, -1)),   # zero rows when the request has no CFG
    )
    Params = EditTextEncoderParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.device = ctx.device
        folder = pipeline_folder(ctx, self.params.checkpoint)
        self.text_encoder = load_component(folder, "text_encoder", self.params.dtype, self.device)

    def hidden_states(self, **inputs) -> torch.Tensor:
        """[rows, tokens, D]: the text embeddings the transformer was trained on (the model's last
        hidden states, without the vocabulary projection)."""
        return self.text_encoder.model(**inputs, output_hidden_states=True, use_cache=False).hidden_states[-1]

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        # Every row of every request (prompt, negative: each with its request's images) in one call,
        # right-padded to the longest: the encoder is causal, so padding after a row changes nothing in
        # it, and the multimodal RoPE positions are computed from the attention mask.
        rows = []            # (slot, ids of the real tokens, pixel_values, grid)
        for slot, req in enumerate(requests):
            ids, mask = host(req.get("text_ids")), host(req.get("text_mask"))
            pixels, grid = host(req.get("pixel_values")), host(req.get("image_grid_thw")).reshape(-1, 3)
            for r in range(ids.shape[0]):
                rows.append((slot, ids[r][mask[r] > 0], pixels, grid))
        length = max(len(r[1]) for r in rows)
        ids = np.zeros((len(rows), length), np.int64)
        mask = np.zeros((len(rows), length), np.int64)
        for i, (_, real, _, _) in enumerate(rows):
            ids[i, :len(real)], mask[i, :len(real)] = real, 1
        try:
            with torch.inference_mode():
                hidden = self.hidden_states(
                    input_ids=torch.from_numpy(ids).to(self.device), attention_mask=torch.from_numpy(mask).to(self.device),
                    pixel_values=torch.from_numpy(np.concatenate([r[2] for r in rows])).to(
                        self.device, self.text_encoder.dtype),
                    image_grid_thw=torch.from_numpy(np.concatenate([r[3] for r in rows])).to(self.device))
        except Exception as exc:  # noqa: BLE001 - the batch fails together
            return [exc] * len(requests)
        drop = self.params.drop_tokens
        mine: dict[int, list[torch.Tensor]] = {}
        for i, (slot, real, _, _) in enumerate(rows):
            mine.setdefault(slot, []).append(hidden[i, drop:len(real)].float())
        results = []
        for slot in range(len(requests)):
            embeds = mine[slot]
            negative = embeds[1] if len(embeds) > 1 else embeds[0].new_zeros((0, embeds[0].shape[-1]))
            results.append({"prompt_embeds": to_output(embeds[0]), "negative_embeds": to_output(negative)})
        return results


# -- VAE decode ----------------------------------------------------------------------------------------
class OneFrame(torch.nn.Module):
    """The video VAE as the shared decode step expects an image VAE: [B, C, h, w] in, [B, 3, H, W] out."""

    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    @property
    def dtype(self):
        return self.vae.dtype

    @property
    def config(self):
        return self.vae.config

    def decode(self, z: torch.Tensor, return_dict: bool = False):
        return (self.vae.decode(z.unsqueeze(2), return_dict=False)[0][:, :, 0],)


class OneFrameVaeDecode(VaeDecodeStep):
    """The shared VAE decode on a video VAE: each image decoded as one frame. A model still says how
    its latents map into the VAE's space (`to_vae_space`)."""

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.vae = OneFrame(self.vae)
