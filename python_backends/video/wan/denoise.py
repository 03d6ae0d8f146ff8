"""Wan2.2's denoise steps, after diffusers' `WanPipeline` and `WanImageToVideoPipeline` loops.

Per clip: noise [1, C, F, h, w] drawn from the request's seed on the CPU (as the pipelines draw it
with a CPU generator), the checkpoint's UniPC flow schedule in a scheduler of its own, and per step:
- TI2V-5B (`expand_timesteps`): the model sees the latents with latent frame 0 replaced by the first
  frame's latents (text+image requests) and a timestep per token, 0 on that frame's tokens, t elsewhere;
  the finished latents get the first frame's latents back at frame 0;
- I2V-A14B: the model sees the latents with the first frame's conditioning (a 4-channel frame mask and
  the VAE latents of [image, black frames...]) concatenated along channels, one timestep per clip;
- T2V: the latents alone, one timestep per clip.
Two experts (A14B): `transformer` while t >= boundary_ratio x 1000, then `transformer_2`, with
guidance_scale and guidance_scale_2; both stay resident. CFG (guidance_scale > 1, the pipelines'
rule) is uncond + g x (cond - uncond), both rows in one call. Clips share a call when their latents
have one shape and their current steps use one expert (timesteps may differ: one per row).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.diffusion.checkpoint import component_config, load_component, load_scheduler, model_index
from triton_omni.diffusion.tensors import to_output, to_torch
from triton_omni.runtime.device import upload
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import register
from triton_omni.video.denoise import CONDITION_IN, ClipState, Row, VideoDenoiseStep
from triton_omni.video.loop import Clip


@dataclass(eq=False)
class WanClip(ClipState):
    condition: torch.Tensor | None = None     # [1, C', F', h, w] float32 on the device
    token_mask: torch.Tensor | None = None    # [tokens]: 0 on the first frame's tokens when it is given (TI2V)


def wan_geometry(folder) -> tuple[int, int, int]:
    """(pixels a frame side is a multiple of, frames per latent frame after the first, experts), read
    from the configs as the pipelines compute them (VAE spatial factor x transformer patch)."""
    vae, transformer = component_config(folder, "vae"), component_config(folder, "transformer")
    patch = transformer.get("patch_size", [1, 2, 2])
    second = model_index(folder).get("transformer_2") or [None, None]
    return (vae.get("scale_factor_spatial", 8) * max(patch[1], patch[2]), vae.get("scale_factor_temporal", 4),
            2 if second[0] else 1)


@register("wan_denoise")
class WanDenoise(VideoDenoiseStep):
    def load(self) -> None:
        index = model_index(self.folder)
        self.transformer = load_component(self.folder, "transformer", self.params.dtype, self.device)
        second = index.get("transformer_2") or [None, None]
        self.transformer_2 = (load_component(self.folder, "transformer_2", self.params.dtype, self.device)
                              if second[0] else None)
        self.scheduler = load_scheduler(self.folder)
        self.expand = bool(index.get("expand_timesteps", False))
        ratio = index.get("boundary_ratio")
        self.boundary = None if ratio is None else ratio * self.scheduler.config.num_train_timesteps
        vae = component_config(self.folder, "vae")
        self.z_dim = vae["z_dim"]
        self.multiple, self.temporal, _ = wan_geometry(self.folder)
        self.scale = vae.get("scale_factor_spatial", 8)
        self.patch = tuple(self.transformer.config.patch_size)
        self.text_dim = self.transformer.config.text_dim
        self.dtype = self.transformer.dtype
        # the conditioning's channels: I2V-A14B concatenates a frame mask (temporal channels) and the
        # latents of the first frame's clip; TI2V replaces frame 0 (z_dim channels); T2V has none
        self.condition_channels = self.transformer.config.in_channels - self.z_dim if not self.expand else self.z_dim

    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 1.0          # the pipelines' do_classifier_free_guidance

    def transformers(self) -> list[torch.nn.Module]:
        return [m for m in (self.transformer, self.transformer_2) if m is not None]

    def latent_shape(self, clip: Clip) -> tuple[int, ...]:
        s = clip.inputs
        return (self.z_dim, (int(s["num_frames"]) - 1) // self.temporal + 1, int(s["height"]) // self.scale,
                int(s["width"]) // self.scale)

    def check(self, inputs: dict) -> None:
        condition = inputs["condition"]
        takes = any(t.name == "condition" for t in self.inputs)
        if not takes or (condition is None and self.expand):
            return                              # T2V, or a TI2V request from text alone
        c, f, h, w = self.latent_shape(Clip("", None, 0, inputs))
        want = (self.condition_channels, 1 if self.expand else f, h, w)
        if condition is None or tuple(condition.shape) != want:
            got = "none" if condition is None else f"shape {list(condition.shape)}"
            raise InvalidInput("condition", f"{got}: this clip needs the first frame's conditioning, "
                                            f"shape {list(want)}")

    def start(self, clip: Clip) -> None:
        s = clip.inputs
        shape = (1, *self.latent_shape(clip))
        noise = torch.randn(shape, generator=torch.Generator().manual_seed(int(s["seed"])), dtype=torch.float32)
        # The clip's scheduler stays on the host (its sigmas live there in any case): setting it up
        # uploads nothing, so admitting a clip never waits for the rounds in flight on the device.
        scheduler = copy.deepcopy(self.scheduler)
        scheduler.set_timesteps(clip.steps, device="cpu")
        scheduler.set_begin_index(0)
        timesteps = scheduler.timesteps.tolist()
        condition = None if s["condition"] is None else to_torch(s["condition"], self.device, torch.float32)[None]
        token_mask = None
        if self.expand:
            # the pipeline's first_frame_mask[0][0][:, ::p, ::p]: one value per token after patching
            f, h, w = shape[2], shape[3] // self.patch[1], shape[4] // self.patch[2]
            token_mask = torch.ones((f, h, w), dtype=torch.float32)
            if condition is not None:
                token_mask[0] = 0
            token_mask = upload(token_mask.flatten(), self.device, torch.float32)
        clip.state = WanClip(latents=upload(noise, self.device, torch.float32), prompt=self.padded_text(s["prompt"]),
                             negative=None if s["negative"] is None else self.padded_text(s["negative"]),
                             scheduler=scheduler, timesteps=timesteps, condition=condition, token_mask=token_mask)

    def expert(self, clip: Clip) -> int:
        """0: `transformer` (high noise), 1: `transformer_2`, for the clip's next step."""
        t = clip.state.timesteps[clip.launched]
        return 0 if self.boundary is None or t >= self.boundary else 1

    def group_key(self, clip: Clip):
        return self.latent_shape(clip), self.expert(clip)

    def row(self, clip: Clip) -> Row:
        s = clip.state
        t = s.timesteps[clip.launched]
        if self.expand:        # a timestep per token: the pipeline's (mask * t), made on the device
            x = s.latents if s.condition is None else torch.cat([s.condition, s.latents[:, :, 1:]], dim=2)
            return Row(x.to(self.dtype), (s.token_mask * t)[None], s.prompt)
        x = s.latents if s.condition is None else torch.cat([s.latents, s.condition], dim=1)
        return Row(x.to(self.dtype), torch.full((1,), t, dtype=torch.int64, device=self.device), s.prompt)

    def advance(self, clips: list[Clip]) -> None:
        expert = self.expert(clips[0])
        model = self.transformers()[expert]
        scale = (lambda c: float(c.inputs["guidance_scale"])) if expert == 0 else \
            (lambda c: float(c.inputs["guidance_scale_2"]))
        preds = self.guided(clips, self.row, lambda r: model(hidden_states=r.x, timestep=r.timestep,
                                                              encoder_hidden_states=r.context, return_dict=False)[0],
                            scale)
        for clip, pred in zip(clips, preds):
            s = clip.state
            # UniPC reads its step index (set_begin_index) and host sigmas, not the timestep's value
            s.latents = s.scheduler.step(pred, s.scheduler.timesteps[clip.launched], s.latents, return_dict=False)[0]
            clip.launched += 1

    def result(self, clip: Clip) -> dict:
        s = clip.state
        latents = s.latents
        if self.expand and s.condition is not None:
            latents = torch.cat([s.condition, latents[:, :, 1:]], dim=2)
        return {"latents": to_output(latents[0].float()), "fps": np.array([int(clip.inputs["fps"])], np.int32)}


@register("wan_image_denoise")
class WanImageDenoise(WanDenoise):
    """The models that take a first frame (TI2V-5B: optional, I2V-A14B: required)."""
    inputs = (*WanDenoise.inputs, CONDITION_IN)

    def input_limits(self) -> dict:
        side = self.params.max_side // self.scale
        frames = 1 if self.expand else (self.params.max_frames - 1) // self.temporal + 1
        return {**super().input_limits(), "condition": (self.condition_channels, frames, side, side)}
