"""The Cosmos3 text-to-video denoise step, after `Cosmos3OmniPipeline.__call__` (T2V: no frame
conditioned, so every latent frame is noisy and the pipeline's velocity mask is all ones).

A clip starts from float32 noise drawn with the request's seed in the latents' shape [1, 48, T, h, w]
(the pipeline's randn_tensor on the CPU), its own UniPC scheduler (the flow sigmas, or the native
linear schedule when the folder says `use_native_flow_schedule`), and per branch the text keys /
values from the text encoder step and its video tokens' mRoPE (their temporal offset follows the
branch's text length, their time axis the clip's fps). A step runs the generation pathway for the
conditional rows of every clip of a group and the unconditional rows of those that use CFG
(guidance_scale != 1), all in one call (model.py), each row its own timestep and text length; then,
in float32 as the pipeline, uncond + g x (cond - uncond) and the clip's scheduler step. Clips share a
call when their latents have one shape.
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
from triton_omni.video.cosmos3.model import denoise_rows, gen_positions, keep_half, kv_width, rotary
from triton_omni.video.cosmos3.steps import cosmos3_geometry
from triton_omni.video.denoise import ClipState, VideoDenoiseStep
from triton_omni.video.loop import Clip


@dataclass(eq=False)
class Cosmos3Clip(ClipState):
    rope: tuple = ()                 # (cos, sin) of the conditional branch's video tokens
    negative_rope: tuple = ()        # the same after the negative prompt (its own text length)


@register("cosmos3_denoise")
class Cosmos3Denoise(VideoDenoiseStep):
    def load(self) -> None:
        self.transformer = load_component(self.folder, "transformer", self.params.dtype, self.device)
        keep_half(self.transformer, "gen")
        self.scheduler = load_scheduler(self.folder)
        self.native_schedule = bool(model_index(self.folder).get("use_native_flow_schedule", False))
        self.z_dim = component_config(self.folder, "vae")["z_dim"]
        self.multiple, self.temporal, _ = cosmos3_geometry(self.folder)
        self.scale = self.multiple
        self.text_dim = kv_width(self.transformer.config)
        self.dtype = self.transformer.proj_in.weight.dtype

    def transformers(self) -> list[torch.nn.Module]:
        return [self.transformer]

    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale != 1.0         # the pipeline's do_classifier_free_guidance

    def check(self, inputs: dict) -> None:
        negative = inputs["negative"]
        if negative is not None and negative.shape[0] == 0:
            raise InvalidInput("negative_embeds", "this clip uses CFG (guidance_scale != 1): the negative prompt's "
                                                  "keys and values are required (the pre step always makes some)")

    def latent_shape(self, clip: Clip) -> tuple[int, ...]:
        s = clip.inputs
        return (self.z_dim, (int(s["num_frames"]) - 1) // self.temporal + 1, int(s["height"]) // self.scale,
                int(s["width"]) // self.scale)

    def _rope(self, text_len: int, clip: Clip) -> tuple:
        ids = gen_positions(self.transformer, text_len, self.latent_shape(clip)[1:], float(clip.inputs["fps"]),
                            self.temporal)
        # float ids: fps modulation makes the time axis fractional (e.g. 2.4 a latent frame at 10 fps)
        return rotary(self.transformer, upload(ids, self.device, torch.float32), self.dtype)

    def start(self, clip: Clip) -> None:
        s = clip.inputs
        shape = (1, *self.latent_shape(clip))
        noise = torch.randn(shape, generator=torch.Generator().manual_seed(int(s["seed"])), dtype=torch.float32)
        scheduler = copy.deepcopy(self.scheduler)
        if self.native_schedule:
            sigmas = np.linspace(1.0 - 1.0 / scheduler.config.num_train_timesteps, 0.0, clip.steps + 1)[:-1]
            scheduler.set_timesteps(clip.steps, device="cpu", sigmas=sigmas)
        else:
            scheduler.set_timesteps(clip.steps, device="cpu")
        prompt, negative = s["prompt"], s["negative"]
        clip.state = Cosmos3Clip(
            latents=upload(noise, self.device, torch.float32), prompt=to_torch(prompt, self.device, self.dtype),
            negative=None if negative is None else to_torch(negative, self.device, self.dtype), scheduler=scheduler,
            timesteps=scheduler.timesteps.tolist(), rope=self._rope(prompt.shape[0], clip),
            negative_rope=() if negative is None else self._rope(negative.shape[0], clip))

    def group_key(self, clip: Clip):
        return self.latent_shape(clip)

    def advance(self, clips: list[Clip]) -> None:
        cfg = [c for c in clips if c.state.negative is not None]
        rows = [(c, c.state.prompt, c.state.rope) for c in clips] + \
               [(c, c.state.negative, c.state.negative_rope) for c in cfg]
        preds = denoise_rows(self.transformer, [c.state.latents for c, _, _ in rows],
                             [c.state.timesteps[c.launched] for c, _, _ in rows], [kv for _, kv, _ in rows],
                             [rope for _, _, rope in rows])
        uncond = {id(c): p.float() for c, p in zip(cfg, preds[len(clips):])}
        for clip, pred in zip(clips, preds):
            s = clip.state
            velocity = pred.float()
            if id(clip) in uncond:
                u = uncond[id(clip)]
                velocity = u + float(clip.inputs["guidance_scale"]) * (velocity - u)
            # as the pipeline: the scheduler finds its step from the timestep (no begin index), and an
            # extra leading dim on sample and prediction
            t = s.scheduler.timesteps[clip.launched]
            s.latents = s.scheduler.step(velocity.unsqueeze(0), t, s.latents.unsqueeze(0), return_dict=False)[0] \
                .squeeze(0)
            clip.launched += 1

    def result(self, clip: Clip) -> dict:
        return {"latents": to_output(clip.state.latents[0].float()),
                "fps": np.array([int(clip.inputs["fps"])], np.int32)}
