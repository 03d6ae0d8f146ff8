"""The batched denoise step shared by the image models: requests in, final latents out.

One execute gets whatever Triton's dynamic batcher collected. Requests whose latents have the same
shape and whose schedules have the same length run together in one loop: each model call carries
every image of every request in the group (n per request) plus, only for requests that use
classifier-free guidance, their unconditional branch. Requests of other sizes form their own
groups, run one after the other in the same execute.

A model subclass says what the noise looks like (`latent_shape`) and runs the loop (`run`); the
schedule is computed on the host once per (steps, size), staged on the device, and indexed there,
so the loop itself never waits for the device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

import torch

from triton_omni.diffusion.attention import set_attention
from triton_omni.diffusion.checkpoint import load_component, load_scheduler, pipeline_folder, vae_scale_factor
from triton_omni.diffusion.tensors import group_by, to_output, to_torch
from triton_omni.image import warmup as image_warmup
from triton_omni.image.checks import check_settings
from triton_omni.image.denoise_metrics import DenoiseMetrics
from triton_omni.image.request import ServedSizes
from triton_omni.models import quant
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext


@dataclass
class DenoiseParams(ServedSizes):
    checkpoint: str = ""
    max_sequence_length: int = 4096    # text-embedding tokens per prompt at most (the edit models' count
                                       #   the image's tokens too; the text-to-image ensembles set theirs)
    dtype: str = "float32"
    compile: bool = False              # GPU: torch.compile each repeated transformer block (regional:
                                       #   one compiled block serves all layers; a new shape compiles on first use)
    attention: str = "native"          # the transformer's attention kernel (diffusion/attention.py)
    quantization: str = "none"         # "fp8": the repeated blocks' linear layers in FP8 E4M3 at load, a scale per
                                       #   output channel, the activations one a row (torch._scaled_mm on the GPU;
                                       #   models/quant.quantize_blocks); compiled with them where `compile` is on


# Where a transformer's config gives the width of the text embeddings it takes (Z-Image, FLUX.2 and
# Qwen-Image, JoyImage).
TEXT_DIM_KEYS = ("cap_feat_dim", "joint_attention_dim", "text_dim")


@dataclass
class Job:
    """One request in the denoise step."""

    slot: int                              # its place in the execute batch
    prompt: torch.Tensor                   # [L, D] text embeddings, on the device
    negative: torch.Tensor | None          # [L', D]; None: no unconditional branch
    width: int
    height: int
    steps: int
    guidance: float
    seed: int
    n: int


def settings_job(slot: int, settings: dict, prompt: torch.Tensor, negative: torch.Tensor | None) -> Job:
    """A Job from `check_settings`' values and the request's text conditioning."""
    return Job(slot=slot, prompt=prompt, negative=negative, width=int(settings["width"]),
               height=int(settings["height"]), steps=int(settings["num_inference_steps"]),
               guidance=float(settings["guidance_scale"]), seed=int(settings["seed"]), n=int(settings["n"]))


@dataclass
class Guidance:
    """Which image rows of a group also run unconditionally, and their scales (on the device)."""

    rows: torch.Tensor | None              # [R] long: rows that have a negative branch; None: no row has
    scale: torch.Tensor | None             # [R] float32
    negatives: list[torch.Tensor]          # per such row, its negative embeddings


class DenoiseStep(Step):
    inputs = (
        TensorSpec("prompt_embeds", "TYPE_FP32", (-1, -1), ragged=True),
        TensorSpec("negative_embeds", "TYPE_FP32", (-1, -1), ragged=True),
        TensorSpec("width", "TYPE_INT32", (1,)),
        TensorSpec("height", "TYPE_INT32", (1,)),
        TensorSpec("num_inference_steps", "TYPE_INT32", (1,)),
        TensorSpec("guidance_scale", "TYPE_FP32", (1,)),
        TensorSpec("seed", "TYPE_INT64", (1,)),
        TensorSpec("n", "TYPE_INT32", (1,)),
    )
    outputs = (TensorSpec("latents", "TYPE_FP32", (-1, -1, -1, -1)),)   # [n, C, h, w] per request
    Params = DenoiseParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.device = ctx.device
        self.folder = pipeline_folder(ctx, self.params.checkpoint)
        self.transformer = load_component(self.folder, "transformer", self.params.dtype, self.device)
        self.dtype = self.transformer.dtype
        self.scheduler = load_scheduler(self.folder)
        if getattr(self.scheduler.config, "stochastic_sampling", False):
            raise ValueError(f"{ctx.model_name}: stochastic flow-match sampling is not supported")
        self.vae_scale = vae_scale_factor(self.folder)
        self.multiple = self.vae_scale * 2          # output sides: VAE factor x the 2x2 latent patches
        self.text_dim = next(getattr(self.transformer.config, k) for k in TEXT_DIM_KEYS
                             if getattr(self.transformer.config, k, None))
        self._schedules: dict[Hashable, tuple] = {}
        self.set_attention(self.params.attention)
        if self.params.quantization != "none":
            quant.quantize_blocks(self.transformer, self.params.quantization)
        self.compiled = self.params.compile and torch.device(self.device).type == "cuda"
        if self.compiled:
            self.transformer.compile_repeated_blocks(fullgraph=True)
        self.metrics = DenoiseMetrics(ctx.model_name, self.device)

    def set_attention(self, name: str) -> None:
        set_attention(self.transformer, name, self.device)

    def input_limits(self) -> dict:
        tokens = (self.params.max_sequence_length, None)
        return {"prompt_embeds": tokens, "negative_embeds": tokens}

    # -- what a model says ----------------------------------------------------------------------
    def latent_shape(self, job: Job) -> tuple[int, ...]:
        """The shape of one image's initial noise, as the pipeline's `prepare_latents` draws it."""
        raise NotImplementedError

    def group_key(self, job: Job) -> Hashable:
        return self.latent_shape(job), job.steps

    def run(self, jobs: list[Job], noise: torch.Tensor) -> torch.Tensor:
        """Denoise one group; returns the final latents, one row per image, in `noise`'s order."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------------
    def initial_noise(self, jobs: list[Job]) -> torch.Tensor:
        # One CPU generator per request, seeded with its seed, drawing its n images at once: the
        # numbers the pipeline draws with `generator=torch.Generator().manual_seed(seed)`,
        # whichever requests share the batch and whichever device runs the model.
        draws = [torch.randn((j.n, *self.latent_shape(j)), generator=torch.Generator().manual_seed(j.seed),
                             dtype=torch.float32) for j in jobs]
        return torch.cat(draws).to(self.device)

    def guidance(self, jobs: list[Job]) -> Guidance:
        rows, scales, negatives, row = [], [], [], 0
        for j in jobs:
            for _ in range(j.n):
                if j.negative is not None:
                    rows.append(row)
                    scales.append(j.guidance)
                    negatives.append(j.negative)
                row += 1
        if not rows:
            return Guidance(None, None, [])
        return Guidance(torch.tensor(rows, device=self.device), torch.tensor(scales, device=self.device), negatives)

    def warmup_inputs(self, spec) -> list[dict]:
        if [t.name for t in self.inputs] != [t.name for t in DenoiseStep.inputs]:
            return []                  # a model's own inputs (an edit model's image latents): its own samples
        return image_warmup.denoise_samples(spec, self.text_dim)

    def staged_schedule(self, key: Hashable, make) -> tuple:
        """A schedule computed once on the host by `make()` and kept on the device."""
        if key not in self._schedules:
            self._schedules[key] = make()
        return self._schedules[key]

    def job(self, slot: int, req: Request) -> Job:
        settings = check_settings(req, self.multiple, self.params)
        prompt = req.get("prompt_embeds")
        negative = req.get("negative_embeds")
        if prompt is None or prompt.shape[0] == 0:
            raise InvalidInput("prompt_embeds", "no prompt embeddings")
        has_negative = negative is not None and negative.shape[0] > 0
        for name, embeds in (("prompt_embeds", prompt), ("negative_embeds", negative if has_negative else None)):
            if embeds is not None and embeds.shape[1] != self.text_dim:
                raise InvalidInput(name, f"shape {list(embeds.shape)}: this model takes {self.text_dim} values a token")
        return settings_job(slot, settings, to_torch(prompt, self.device, self.dtype),
                            to_torch(negative, self.device, self.dtype) if has_negative else None)

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        results: list[dict | BaseException | None] = [None] * len(requests)
        jobs = []
        for slot, req in enumerate(requests):
            try:
                jobs.append(self.job(slot, req))
            except InvalidInput as exc:
                results[slot] = exc
        for group in group_by(jobs, self.group_key).values():
            try:
                start = self.metrics.start()
                with torch.inference_mode():
                    latents = self.run(group, self.initial_noise(group))
                for job, lat in zip(group, latents.split([j.n for j in group])):
                    results[job.slot] = {"latents": to_output(lat.float())}
                self.metrics.done(start, group[0].steps, sum(j.n for j in group), len(group))
            except Exception as exc:  # noqa: BLE001 - this group fails; other groups still get images
                for job in group:
                    results[job.slot] = exc
        return results
