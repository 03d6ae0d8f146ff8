"""FLUX.2-klein: the pre, text encoder, denoise and VAE decode steps, after diffusers' `Flux2KleinPipeline`.

pre           the shared tokenizing pre step (image/pre.py), no thinking flag; CFG for guidance > 1
              unless model_index.json marks the checkpoint step-distilled.
text encoder  Qwen3: hidden states of layers 9, 18 and 27 stacked per token -> [512, 3 * D]; the
              layers past 27 are not run. The padded positions are part of the conditioning (the
              transformer attends to all of them), so every prompt keeps the full `max_sequence_length`.
denoise       Flux2Transformer2DModel on packed latents [B, h*w, 4C] with 4-D RoPE ids.
              Sigmas linspace(1, 1/N, N), shifted by the empirical mu for (h*w, N);
              CFG is neg + g * (pos - neg) for g > 1 on undistilled checkpoints.
VAE decode    AutoencoderKLFlux2: undo the batch-norm latent statistics, unpatch 2x2, decode.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from triton_omni.image.checkpoint import model_index
from triton_omni.image.denoise import DenoiseStep, Job
from triton_omni.image.pre import ImagePre
from triton_omni.image.text_encoder import TextEncoderParams, TextEncoderStep
from triton_omni.image.vae import VaeDecodeStep
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request, StepContext, register

def _pipeline():
    """diffusers' Flux2KleinPipeline module (imported when a FLUX.2 step runs, not when the converter
    lists the steps): its static helpers pack latents, make position ids and the schedule's shift."""
    from diffusers.pipelines.flux2 import pipeline_flux2_klein

    return pipeline_flux2_klein


@dataclass
class Flux2TextEncoderParams(TextEncoderParams):
    hidden_states_layers: list[int] = field(default_factory=lambda: [9, 18, 27])


@register("flux2_klein_pre")
class Flux2KleinPre(ImagePre):
    enable_thinking = False

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        # Step-distilled checkpoints (FLUX.2-klein-4B/9B) ignore guidance; the base ones use CFG above 1.
        self.distilled = bool(model_index(self.folder).get("is_distilled", False))

    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 1 and not self.distilled


@register("flux2_klein_text_encoder")
class Flux2KleinTextEncoder(TextEncoderStep):
    Params = Flux2TextEncoderParams

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> list[torch.Tensor]:
        # Only the layers up to the deepest one read run (27 of Qwen3-4B's 36).
        states = self.hidden_states(torch.from_numpy(ids.astype(np.int64)).to(self.device),
                                    torch.from_numpy(mask.astype(np.int64)).to(self.device),
                                    self.params.hidden_states_layers)
        stacked = torch.stack(states, dim=1)
        rows, layers, length, dim = stacked.shape
        return list(stacked.permute(0, 2, 1, 3).reshape(rows, length, layers * dim).unbind(0))


@register("flux2_klein_denoise")
class Flux2KleinDenoise(DenoiseStep):
    def latent_shape(self, job: Job) -> tuple[int, ...]:
        s = self.vae_scale * 2
        return self.transformer.config.in_channels, job.height // s, job.width // s

    def job(self, slot: int, req: Request) -> Job:
        job = super().job(slot, req)
        # The guided rows run in one call with the prompts: their texts must have the same length.
        if job.negative is not None and job.negative.shape[0] != job.prompt.shape[0]:
            raise InvalidInput("negative_embeds", f"{job.negative.shape[0]} tokens; this model needs as many as "
                                                  f"prompt_embeds has ({job.prompt.shape[0]})")
        return job

    def group_key(self, job: Job):
        return self.latent_shape(job), job.steps, job.prompt.shape[0]   # one set of text position ids

    def schedule(self, steps: int, image_seq_len: int):
        mu = _pipeline().compute_empirical_mu(image_seq_len=image_seq_len, num_steps=steps)
        if getattr(self.scheduler.config, "use_flow_sigmas", False):
            self.scheduler.set_timesteps(steps, device="cpu", mu=mu)
        else:   # as `retrieve_timesteps` calls it when given sigmas
            self.scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), device="cpu", mu=mu)
        return self.scheduler.timesteps.to(self.device), self.scheduler.sigmas.to(self.device)

    def run(self, jobs: list[Job], noise: torch.Tensor) -> torch.Tensor:
        batch, channels, h, w = noise.shape
        steps = jobs[0].steps
        timesteps, sigmas = self.staged_schedule((steps, h, w), lambda: self.schedule(steps, h * w))
        latent_ids = _pipeline().Flux2KleinPipeline._prepare_latent_ids(noise)[0].to(self.device)          # [h*w, 4]
        prompts = torch.stack([j.prompt for j in jobs for _ in range(j.n)])       # [B, L, D]
        text_ids = _pipeline().Flux2KleinPipeline._prepare_text_ids(prompts)[0].to(self.device)             # [L, 4]
        g = self.guidance(jobs)
        scale = g.scale.view(-1, 1, 1) if g.rows is not None else None
        context = torch.cat([prompts, torch.stack(g.negatives)]) if g.rows is not None else prompts
        latents = _pipeline().Flux2KleinPipeline._pack_latents(noise)                                       # [B, h*w, C]
        for i in range(steps):
            timestep = timesteps[i].expand(batch).to(latents.dtype)
            x = latents.to(self.dtype)
            if g.rows is not None:
                x = torch.cat([x, x.index_select(0, g.rows)])
                timestep = torch.cat([timestep, timestep.index_select(0, g.rows)])
            out = self.transformer(hidden_states=x, encoder_hidden_states=context, timestep=timestep / 1000,
                                   img_ids=latent_ids, txt_ids=text_ids, guidance=None, return_dict=False)[0]
            out = out[:, :latents.shape[1]]
            pred = out[:batch]
            if g.rows is not None:
                pos, neg = pred.index_select(0, g.rows), out[batch:]
                pred = pred.index_copy(0, g.rows, neg + scale * (pos - neg))
            # Flow-match Euler step (FlowMatchEulerDiscreteScheduler.step), kept in float32.
            latents = latents.float() + (sigmas[i + 1] - sigmas[i]) * pred.float()
        return latents.reshape(batch, h, w, channels).permute(0, 3, 1, 2)   # unpack: [B, C, h, w]


@register("flux2_klein_vae_decode")
class Flux2KleinVaeDecode(VaeDecodeStep):
    def latent_layout(self) -> tuple[int, int]:
        # The denoiser's latents are 2x2 patches of the VAE's: four times the channels, half the side.
        return self.vae.config.latent_channels * 4, self.vae_scale * 2

    def to_vae_space(self, latents: torch.Tensor) -> torch.Tensor:
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(latents.device, latents.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps).to(latents.device,
                                                                                                 latents.dtype)
        return _pipeline().Flux2KleinPipeline._unpatchify_latents(latents * std + mean)
