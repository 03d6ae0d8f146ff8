"""BAGEL text to image (route image_generation): the steps of the release's text-to-image inference
(ByteDance-Seed/Bagel, `InterleaveInferencer` with a text prompt), over the model in model.py.

pre           checks the request; sizes snap down to multiples of 16 (VAE 8x, 2x2 latent patches) and may
              not exceed the latent position table (64 patches = 1024 px a side in the release). Tokenizes
              <|im_start|> prompt <|im_end|>, as the release wraps a text input.
denoise       prefills the prompts of the whole group once (the understanding half of the MoT, batched,
              right-padded with a mask) and keeps their KV cache for the loop; then every step is one model
              call over every image of every request of the group plus, for requests with guidance > 1 and
              while t is inside cfg_interval, their unconditional rows (the same image block with an empty
              context). Timesteps linspace(1, 0, steps + 1) shifted by timestep_shift; CFG
              v_u + g (v_c - v_u), then renormed to at most the conditional velocity's norm ("global": over
              the whole image; the release's defaults are cfg_renorm_min 0, type global).
vae_decode    FLUX's autoencoder: unpatchify, z / 0.3611 + 0.1159, decode.

Why no separate text encoder step: the text encoder is the understanding expert of the very MoT the denoise
step runs (its marker tokens use those weights), so a separate step would hold a second copy of half the
7B model and ship per-layer KV caches between processes; the prefill is a few ms next to the loop.

Differences from the release, on purpose: `num_inference_steps` counts model calls (the release's
num_timesteps is one more: its default 50 is our 49); no negative prompt (the release's unconditional
branch is the empty context; a negative prompt is refused); pixels are rounded to uint8 as the other image
models here round them (the release truncates: at most one level lower); noise is drawn per request from
a CPU generator seeded with its seed, in the release's packed order (the release draws from torch's global
generator, which `torch.manual_seed(seed)` makes the same numbers for one image).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from triton_omni.diffusion.checks import check_ids
from triton_omni.image.bagel.model import load_autoencoder, load_generator, release_folder, schedule, unpatchify
from triton_omni.image.checks import check_settings
from triton_omni.image.denoise import DenoiseStep, Job, settings_job
from triton_omni.image.denoise_metrics import DenoiseMetrics
from triton_omni.image.pre import REQUEST_INPUTS, SETTINGS, settings_tensors
from triton_omni.image.request import ImageLimits, ServedSizes, parse_request, parse_size
from triton_omni.image.vae import VaeDecodeStep
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register

BOS, EOS, IMAGE_START, IMAGE_END = "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"
VAE_DOWNSAMPLE = 8


def special_ids(tokenizer) -> dict[str, int]:
    """The ids of the four tokens BAGEL wraps text and images in; a clear error if the tokenizer lacks one."""
    ids = {}
    for token in (BOS, EOS, IMAGE_START, IMAGE_END):
        tid = tokenizer.convert_tokens_to_ids(token)
        if tid is None or tid == tokenizer.unk_token_id:
            raise ValueError(f"the checkpoint's tokenizer has no {token} token")
        ids[token] = int(tid)
    return ids


def load_tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


# -- pre ---------------------------------------------------------------------------------------------------
@dataclass
class BagelPreParams(ImageLimits):
    checkpoint: str = ""
    max_prompt_tokens: int = 1024


@register("bagel_pre")
class BagelPre(Step):
    inputs = REQUEST_INPUTS
    outputs = (
        TensorSpec("text_ids", "TYPE_INT32", (-1, -1)),     # [1, L]: <|im_start|> prompt <|im_end|>
        TensorSpec("text_mask", "TYPE_INT32", (-1, -1)),
        *SETTINGS,
    )
    Params = BagelPreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        from safetensors import safe_open

        folder = release_folder(ctx.path(self.params.checkpoint), ctx.model_name)
        self.tokenizer = load_tokenizer(folder)
        self.ids = special_ids(self.tokenizer)
        self.multiple = VAE_DOWNSAMPLE * 2
        with safe_open(str(folder / "ema.safetensors"), framework="pt") as f:
            table = int(f.get_slice("latent_pos_embed.pos_embed").get_shape()[0])
        # The latent position table has max_latent_size rows and columns of patches: no larger image exists.
        largest = int(round(table ** 0.5)) * self.multiple
        limits = {f.name: getattr(self.params, f.name) for f in dataclasses.fields(ImageLimits)}
        limits["max_side"] = min(limits["max_side"], largest)
        # A default larger than the table (1024x1024 with a checkpoint of a smaller table) shrinks to fit.
        w, h = parse_size(limits["default_size"], self.multiple, ImageLimits(max_side=10**9, max_pixels=10**18))
        shrink = min(1.0, limits["max_side"] / max(w, h))
        w, h = (max(self.multiple, int(x * shrink) // self.multiple * self.multiple) for x in (w, h))
        limits["default_size"] = f"{w}x{h}"
        self.limits = ImageLimits(**limits)

    def one(self, req: Request) -> dict:
        r = parse_request(req, self.multiple, self.limits)
        if r.negative_prompt.strip():
            raise InvalidInput("negative_prompt", "BAGEL has no negative prompt (its guidance compares the prompt "
                                                  "with an empty context); leave it out")
        if any(t in r.prompt for t in self.ids):
            raise InvalidInput("prompt", f"must not contain the special tokens {', '.join(self.ids)}")
        body = self.tokenizer.encode(r.prompt, add_special_tokens=False)
        if len(body) + 2 > self.params.max_prompt_tokens:
            raise InvalidInput("prompt", f"too long: {len(body) + 2} tokens, at most {self.params.max_prompt_tokens}")
        ids = np.array([[self.ids[BOS], *body, self.ids[EOS]]], np.int32)
        return {"text_ids": ids, "text_mask": np.ones_like(ids),
                **settings_tensors(r)}


# -- denoise -----------------------------------------------------------------------------------------------
@dataclass
class BagelDenoiseParams(ServedSizes):
    checkpoint: str = ""
    dtype: str = "float32"
    max_prompt_tokens: int = 1024          # the pre step's: a prompt's tokens, its two markers included
    timestep_shift: float = 3.0            # the release's text-to-image default
    cfg_interval_start: float = 0.4        # guidance runs while cfg_interval_start < t <= cfg_interval_end
    cfg_interval_end: float = 1.0
    cfg_renorm_min: float = 0.0            # the guided velocity's norm is scaled to between this and 1 times
    cfg_renorm_type: str = "global"        #   the conditional one's: per image ("global") or per token ("channel")
    cfg_img_scale: float = 1.0             # the release's image guidance; with a text-only context its branch
                                           #   is the conditional one, so > 1 only amplifies (its app passes 1.5,
                                           #   its notebook 1.0); applied without another model call


@register("bagel_denoise")
class BagelDenoise(DenoiseStep):
    inputs = (
        TensorSpec("text_ids", "TYPE_INT32", (-1, -1), ragged=True),
        TensorSpec("text_mask", "TYPE_INT32", (-1, -1), ragged=True),
        *(t for t in DenoiseStep.inputs if t.name not in ("prompt_embeds", "negative_embeds")),
    )
    Params = BagelDenoiseParams

    def __init__(self, ctx: StepContext):
        Step.__init__(self, ctx)      # not DenoiseStep's: that one loads a diffusers pipeline folder
        if self.params.cfg_renorm_type not in ("global", "channel"):
            raise ValueError(f"{ctx.model_name}: cfg_renorm_type must be 'global' or 'channel', "
                             f"got {self.params.cfg_renorm_type!r}")
        self.device = ctx.device
        folder = release_folder(ctx.path(self.params.checkpoint), ctx.model_name)
        self.model = load_generator(folder, self.params.dtype, self.device)
        self.dtype = self.model.vae2llm.weight.dtype
        self.config = self.model.config
        ids = special_ids(load_tokenizer(folder))
        self.markers = self.model.marker_embeddings(ids[IMAGE_START], ids[IMAGE_END])
        self.vae_scale = VAE_DOWNSAMPLE
        self.multiple = VAE_DOWNSAMPLE * self.config.patch
        # No image is larger than the latent position table (as the pre step finds too).
        self.sizes = dataclasses.replace(self.params, max_side=min(self.params.max_side,
                                                                   self.config.max_latent_size * self.multiple))
        self.vocab = self.model.embed_tokens.num_embeddings
        self._schedules = {}
        self.metrics = DenoiseMetrics(ctx.model_name, self.device)   # DenoiseStep.execute records each batch

    def input_limits(self) -> dict:
        return {"text_ids": (1, self.params.max_prompt_tokens), "text_mask": (1, self.params.max_prompt_tokens)}

    def job(self, slot: int, req: Request) -> Job:
        settings = check_settings(req, self.multiple, self.sizes)
        ids, mask = np.asarray(req.get("text_ids")), np.asarray(req.get("text_mask"))
        check_ids(ids, mask, self.vocab)
        ids = ids.reshape(-1)[mask.reshape(-1) > 0]
        # Job.prompt carries the token ids (host), the KV cache is made per group in `run`.
        return settings_job(slot, settings, torch.from_numpy(ids.astype(np.int64)), None)

    def latent_shape(self, job: Job) -> tuple[int, ...]:
        # The release draws noise as packed patch tokens: [h * w, p * p * C].
        s = self.vae_scale * self.config.patch
        return (job.height // s) * (job.width // s), self.config.patch_dim

    def staged(self, steps: int) -> tuple[torch.Tensor, torch.Tensor, list[bool]]:
        """(t [steps], dt [steps]) on the device and, on the host, whether each step is inside cfg_interval."""
        def make():
            t = schedule(steps, self.params.timestep_shift)
            inside = [self.params.cfg_interval_start < x <= self.params.cfg_interval_end for x in t[:-1].tolist()]
            return t[:-1].to(self.device), (t[:-1] - t[1:]).to(self.device), inside
        return self.staged_schedule(steps, make)

    def context(self, jobs: list[Job]) -> tuple[list, torch.Tensor, torch.Tensor, np.ndarray]:
        """Prefill every request's prompt once (right-padded to the group's longest); returns the KV cache
        and its mask, one row per image, the rotary position of each image's block, and the image -> request map."""
        lengths = [len(j.prompt) for j in jobs]
        longest = max(lengths)
        ids = torch.zeros(len(jobs), longest, dtype=torch.long)
        mask = torch.zeros(len(jobs), longest, dtype=torch.bool)
        for r, j in enumerate(jobs):
            ids[r, :lengths[r]], mask[r, :lengths[r]] = j.prompt, True
        ids, mask = ids.to(self.device), mask.to(self.device)
        cache = self.model.prefill(ids, mask)
        owner = np.repeat(np.arange(len(jobs)), [j.n for j in jobs])
        rows = torch.from_numpy(owner).to(self.device)
        cache = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in cache]
        positions = torch.tensor([lengths[r] for r in owner], dtype=torch.long, device=self.device)
        return cache, mask.index_select(0, rows), positions, owner

    def run(self, jobs: list[Job], noise: torch.Tensor) -> torch.Tensor:
        c = self.config
        batch, tokens, _ = noise.shape
        h = jobs[0].height // (self.vae_scale * c.patch)
        w = jobs[0].width // (self.vae_scale * c.patch)
        t_all, dt_all, inside = self.staged(jobs[0].steps)
        position_ids = (torch.arange(h, device=self.device)[:, None] * c.max_latent_size
                        + torch.arange(w, device=self.device)).flatten()
        cache, cache_mask, positions, owner = self.context(jobs)
        # Rows with guidance > 1 also run unconditionally: the same block with no context at position 0.
        guided = [i for i, r in enumerate(owner) if jobs[r].guidance > 1.0]
        if guided:
            g_rows = torch.tensor(guided, device=self.device)
            scale = torch.tensor([jobs[owner[i]].guidance for i in guided], device=self.device).view(-1, 1, 1)
            cfg_cache = [(torch.cat([k, k.index_select(0, g_rows)]), torch.cat([v, v.index_select(0, g_rows)]))
                         for k, v in cache]
            cfg_mask = torch.cat([cache_mask, torch.zeros_like(cache_mask.index_select(0, g_rows))])
            cfg_positions = torch.cat([positions, torch.zeros_like(g_rows)])
        latents = noise
        for i in range(jobs[0].steps):
            with_cfg = bool(guided) and inside[i]
            x = torch.cat([latents, latents.index_select(0, g_rows)]) if with_cfg else latents
            t = t_all[i].expand(x.shape[0])
            v = self.model.velocity(x, t, position_ids, self.markers,
                                    cfg_positions if with_cfg else positions,
                                    cfg_cache if with_cfg else cache, cfg_mask if with_cfg else cache_mask)
            pred = v[:batch]
            if with_cfg:
                pred = pred.index_copy(0, g_rows, self.guide(pred.index_select(0, g_rows), v[batch:], scale))
            latents = latents - pred * dt_all[i]        # the velocity points from data to noise
        return unpatchify(latents, h, w, c.patch, c.latent_channels)

    def guide(self, cond: torch.Tensor, uncond: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The release's text CFG with renorm, per image: [R, N, P] each."""
        guided = uncond + scale * (cond - uncond)
        if self.params.cfg_img_scale > 1.0:
            guided = cond + self.params.cfg_img_scale * (guided - cond)
        dims = (1, 2) if self.params.cfg_renorm_type == "global" else (2,)
        ratio = torch.linalg.vector_norm(cond, dim=dims, keepdim=True) / (
            torch.linalg.vector_norm(guided, dim=dims, keepdim=True) + 1e-8)
        return guided * ratio.clamp(min=self.params.cfg_renorm_min, max=1.0)


# -- VAE decode --------------------------------------------------------------------------------------------
@dataclass
class BagelVaeParams(ServedSizes):
    checkpoint: str = ""
    dtype: str = "float32"


@register("bagel_vae_decode")
class BagelVaeDecode(VaeDecodeStep):
    Params = BagelVaeParams

    def __init__(self, ctx: StepContext):
        Step.__init__(self, ctx)      # not VaeDecodeStep's: that one loads a diffusers pipeline folder
        self.device = ctx.device
        folder = release_folder(ctx.path(self.params.checkpoint), ctx.model_name)
        self.vae = load_autoencoder(folder, self.params.dtype, self.device)
        self.vae_scale = VAE_DOWNSAMPLE

    def to_vae_space(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        return latents.to(self.vae.dtype) / cfg.scaling_factor + cfg.shift_factor
