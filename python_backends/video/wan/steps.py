"""Wan2.2 (TI2V-5B, T2V-A14B, I2V-A14B): the pre, text encoder, VAE encode and VAE decode steps, after
diffusers' `WanPipeline` and `WanImageToVideoPipeline` (the denoise steps: denoise.py).

pre           the shared video pre step; prompts cleaned as the pipelines clean them (ftfy, HTML
              entities, runs of whitespace), padded to 512 T5 tokens; CFG for guidance_scale > 1.
              Three variants by what the model takes: text only (T2V-A14B), an optional first frame
              (TI2V-5B), a required one (I2V-A14B).
text encoder  UMT5's last hidden state at the prompt's real tokens (the pipelines zero the rest; the
              denoise step pads the zeros back): the padding columns after a batch's longest prompt
              are not run (T5 attends with the mask, so they change nothing).
VAE encode    TI2V-5B: the first frame alone -> its normalised latents (frame 0 of the clip);
              I2V-A14B: [first frame, black frames...] of the clip's length -> normalised latents,
              after a 4-channel mask that marks latent frame 0.
VAE decode    AutoencoderKLWan: latents x std + mean (as the pipelines: / (1 / std)), the whole clip.
"""
from __future__ import annotations

import html

import numpy as np
import torch

from triton_omni.diffusion.checkpoint import load_tokenizer, model_index, pipeline_folder
from triton_omni.diffusion.text_encoder import PromptEncoderStep
from triton_omni.runtime.step import StepContext, register
from triton_omni.video.pre import FIRST_FRAME, VideoPre
from triton_omni.video.vae import VaeDecodeStep, VaeEncodeStep
from triton_omni.video.wan_vae import WanVae, latent_stats
from triton_omni.video.wan.denoise import wan_geometry

try:                                        # ftfy is a dependency; the pipelines clean with it when present
    import ftfy
except ImportError:  # pragma: no cover
    ftfy = None


def prompt_clean(text: str) -> str:
    """As the Wan pipelines clean a prompt: fix mojibake, unescape HTML twice, collapse whitespace."""
    import regex

    if ftfy is not None:
        text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return regex.sub(r"\s+", " ", text).strip()


@register("wan_pre")
class WanPre(VideoPre):
    """Text to video (T2V-A14B): an image is refused."""

    def __init__(self, ctx: StepContext):
        self.folder = pipeline_folder(ctx, ctx.params.checkpoint)
        self.tokenizer = load_tokenizer(self.folder)
        super().__init__(ctx)

    def geometry(self) -> tuple[int, int, int]:
        return wan_geometry(self.folder)

    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 1.0          # the pipelines' do_classifier_free_guidance

    def tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        enc = self.tokenizer([prompt_clean(t) for t in texts], padding="max_length",
                             max_length=self.params.max_sequence_length, truncation=True, add_special_tokens=True,
                             return_attention_mask=True, return_tensors="np")
        return enc["input_ids"].astype(np.int32), enc["attention_mask"].astype(np.int32)


@register("wan_ti2v_pre")
class WanTI2VPre(WanPre):
    """TI2V-5B: text, or text and a first frame."""
    outputs = (*WanPre.outputs, FIRST_FRAME)
    image = "optional"


@register("wan_i2v_pre")
class WanI2VPre(WanPre):
    """I2V-A14B: a first frame is required."""
    outputs = (*WanPre.outputs, FIRST_FRAME)
    image = "required"


@register("wan_text_encoder")
class WanTextEncoder(PromptEncoderStep):
    def encode(self, ids: np.ndarray, mask: np.ndarray) -> list[torch.Tensor]:
        used = np.flatnonzero(mask.any(axis=0))
        keep = int(used[-1]) + 1 if used.size else 1
        ids_t = torch.from_numpy(ids[:, :keep].astype(np.int64)).to(self.device)
        mask_t = torch.from_numpy(mask[:, :keep].astype(np.int64)).to(self.device)
        hidden = self.text_encoder(ids_t, mask_t).last_hidden_state
        lengths = (mask[:, :keep] > 0).sum(axis=1)         # the pipelines keep each row's first seq_len tokens
        return [hidden[r, :int(n)] for r, n in enumerate(lengths)]


@register("wan_vae_decode")
class WanVaeDecode(WanVae, VaeDecodeStep):
    def to_vae_space(self, latents: torch.Tensor) -> torch.Tensor:
        latents = latents.to(self.vae.dtype)
        mean, inv_std = latent_stats(self.vae, latents.device, latents.dtype)
        return latents / inv_std + mean


@register("wan_vae_encode")
class WanVaeEncode(WanVae, VaeEncodeStep):
    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.first_frame_only = bool(model_index(self.folder).get("expand_timesteps", False))

    def condition(self, pixels: torch.Tensor, num_frames: int) -> torch.Tensor:
        b, _, _, height, width = pixels.shape
        video = pixels
        if not self.first_frame_only:             # I2V-A14B: the image, then black frames to the clip's end
            video = torch.cat([pixels, pixels.new_zeros(b, 3, num_frames - 1, height, width)], dim=2)
        latents = self.vae.encode(video.to(self.vae.dtype)).latent_dist.mode().float()
        mean, inv_std = latent_stats(self.vae, latents.device, torch.float32)
        latents = (latents - mean) * inv_std
        if self.first_frame_only:
            return latents
        mask = latents.new_zeros((b, self.temporal, *latents.shape[2:]))
        mask[:, :, 0] = 1.0                          # latent frame 0 is given: the pipeline's mask_lat_size
        return torch.cat([mask, latents], dim=1)
