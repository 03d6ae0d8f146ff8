"""Z-Image (Turbo): the pre, text encoder, denoise and VAE decode steps, after diffusers' `ZImagePipeline`.

pre           the shared tokenizing pre step (image/pre.py) with the chat template's thinking flag on;
              CFG for guidance > 0.
text encoder  Qwen3 (base model); the embeddings are the second-to-last hidden state at the
              prompt's real tokens (padding dropped), so each prompt has its own length; the
              last layer is not run.
denoise       ZImageTransformer2DModel, which takes lists of latents and captions of any lengths; its
              forward runs split (transformer.py): the captions' refinement, RoPE tables and
              masks once per group, the timestep-dependent blocks at every step.
              Sigmas linspace(1, 1/N, N) through the checkpoint's FlowMatchEulerDiscreteScheduler;
              the model sees t' = (1000 - t) / 1000 and predicts the negated velocity;
              CFG is pos + g * (pos - neg) for g > 0.
VAE decode    AutoencoderKL: latents / scaling_factor + shift_factor.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.image.denoise import DenoiseParams, DenoiseStep, Job
from triton_omni.image.pre import ImagePre
from triton_omni.image.text_encoder import TextEncoderStep
from triton_omni.image.vae import VaeDecodeStep
from triton_omni.image.z_image import transformer
from triton_omni.runtime.step import register


@register("z_image_pre")
class ZImagePre(ImagePre):
    enable_thinking = True

    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 0           # ZImagePipeline: CFG whenever the scale is above zero


@register("z_image_text_encoder")
class ZImageTextEncoder(TextEncoderStep):
    def encode(self, ids: np.ndarray, mask: np.ndarray) -> list[torch.Tensor]:
        # Causal attention: a token never sees what follows it, so the padding columns after the
        # batch's longest prompt change nothing and are not run (the pipeline runs all 512).
        used = np.flatnonzero(mask.any(axis=0))
        keep = int(used[-1]) + 1 if used.size else 1
        ids_t = torch.from_numpy(ids[:, :keep].astype(np.int64)).to(self.device)
        mask_t = torch.from_numpy(mask[:, :keep]).to(self.device).bool()
        # The second-to-last hidden state: the last layer (and a causal LM's vocabulary projection) is not run.
        hidden = self.hidden_states(ids_t, mask_t, [-2])[0]
        # Real-token positions come from the host mask: no device sync to find them.
        return [hidden[r].index_select(0, torch.from_numpy(np.flatnonzero(mask[r, :keep])).to(self.device))
                for r in range(len(ids))]


@dataclass
class ZImageDenoiseParams(DenoiseParams):
    cfg_truncation: float = 1.0        # the pipeline's: CFG stops once (1000 - t) / 1000 exceeds this
    cfg_normalization: float = 0.0     # the pipeline's: > 0 caps |guided| at this times |cond|


@register("z_image_denoise")
class ZImageDenoise(DenoiseStep):
    Params = ZImageDenoiseParams

    def __init__(self, ctx):
        super().__init__(ctx)
        self.split_forward = transformer.SplitForward(self.transformer)
        if self.compiled:      # compiled blocks: RoPE in real arithmetic (inductor has no complex codegen)
            transformer.use_real_rotary(self.transformer)

    def latent_shape(self, job: Job) -> tuple[int, ...]:
        s = self.vae_scale * 2
        return self.transformer.config.in_channels, 2 * (job.height // s), 2 * (job.width // s)

    def schedule(self, steps: int, image_seq_len: int):
        """(timesteps, sigmas) on the device, and the host's t-norms for CFG truncation."""
        from diffusers.pipelines.z_image.pipeline_z_image import calculate_shift, get_default_z_image_sigmas

        cfg = self.scheduler.config
        mu = calculate_shift(image_seq_len, cfg.get("base_image_seq_len", 256), cfg.get("max_image_seq_len", 4096),
                             cfg.get("base_shift", 0.5), cfg.get("max_shift", 1.15))
        self.scheduler.set_timesteps(sigmas=get_default_z_image_sigmas(steps), device="cpu", mu=mu)
        timesteps, sigmas = self.scheduler.timesteps.clone(), self.scheduler.sigmas.clone()
        t_norms = ((1000 - timesteps.float()) / 1000).tolist()
        return timesteps.to(self.device), sigmas.to(self.device), t_norms

    def cfg_at(self, t_norm: float) -> bool:
        truncation = self.params.cfg_truncation
        return truncation > 1 or t_norm <= truncation

    def run(self, jobs: list[Job], noise: torch.Tensor) -> torch.Tensor:
        batch, _, h, w = noise.shape
        steps = jobs[0].steps
        timesteps, sigmas, t_norms = self.staged_schedule(
            (steps, h, w), lambda: self.schedule(steps, (h // 2) * (w // 2)))
        captions = [j.prompt for j in jobs for _ in range(j.n)]
        g = self.guidance(jobs)
        scale = g.scale.view(-1, 1, 1, 1) if g.rows is not None else None
        contexts: dict[bool, transformer.ZImageContext] = {}     # without / with the CFG rows

        def context(with_cfg: bool) -> transformer.ZImageContext:
            if with_cfg not in contexts:
                contexts[with_cfg] = transformer.prepare(
                    self.transformer, captions + (g.negatives if with_cfg else []), (1, h, w),
                    real_rotary=self.compiled)
            return contexts[with_cfg]

        latents = noise
        for i in range(steps):
            timestep = (1000 - timesteps[i].expand(batch)) / 1000
            with_cfg = g.rows is not None and self.cfg_at(t_norms[i])
            x = latents.to(self.dtype)
            x_in, t_in = x, timestep
            if with_cfg:
                x_in = torch.cat([x, x.index_select(0, g.rows)])
                t_in = torch.cat([timestep, timestep.index_select(0, g.rows)])
            out = self.split_forward(context(with_cfg), x_in.unsqueeze(2), t_in)
            out = out.squeeze(2).float()
            pred = out[:batch]
            if with_cfg:
                pos, neg = pred.index_select(0, g.rows), out[batch:]
                guided = pos + scale * (pos - neg)
                if self.params.cfg_normalization > 0:
                    pos_norm = torch.linalg.vector_norm(pos, dim=(1, 2, 3), keepdim=True)
                    new_norm = torch.linalg.vector_norm(guided, dim=(1, 2, 3), keepdim=True)
                    max_norm = pos_norm * self.params.cfg_normalization
                    guided = torch.where(new_norm > max_norm, guided * (max_norm / new_norm), guided)
                pred = pred.index_copy(0, g.rows, guided)
            # Flow-match Euler step on the negated prediction (FlowMatchEulerDiscreteScheduler.step).
            latents = latents + (sigmas[i + 1] - sigmas[i]) * -pred
        return latents


@register("z_image_vae_decode")
class ZImageVaeDecode(VaeDecodeStep):
    def to_vae_space(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        return latents.to(self.vae.dtype) / cfg.scaling_factor + cfg.shift_factor
