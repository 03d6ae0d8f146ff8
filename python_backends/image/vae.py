"""The VAE decode step shared by the image models: final latents in, RGB pixels out.

Requests whose latents have the same shape decode in one call. A model subclass says how the
denoiser's latents map into the VAE's space (`to_vae_space`: scale and shift, or batch-norm
statistics and unpatching). Pixels leave as uint8, rounded exactly as the pipelines round them
on their way to PIL, so the encode step only has to compress.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from triton_omni.diffusion.checkpoint import load_component, pipeline_folder, vae_scale_factor
from triton_omni.diffusion.tensors import group_by, to_output, to_torch, to_uint8
from triton_omni.image import warmup as image_warmup
from triton_omni.image.checks import check_latents
from triton_omni.image.request import ServedSizes
from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext


@dataclass
class VaeDecodeParams(ServedSizes):
    checkpoint: str = ""
    dtype: str = "float32"
    compile: bool = False              # GPU: torch.compile the VAE decode (`decode`; a new latent shape
                                       #   compiles on first use); ignored on CPU


class VaeDecodeStep(Step):
    inputs = (TensorSpec("latents", "TYPE_FP32", (-1, -1, -1, -1), ragged=True),)
    outputs = (TensorSpec("pixels", "TYPE_UINT8", (-1, -1, -1, 3)),)     # [n, H, W, 3] per request
    Params = VaeDecodeParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.device = ctx.device
        self.folder = pipeline_folder(ctx, self.params.checkpoint)
        self.vae = load_component(self.folder, "vae", self.params.dtype, self.device)
        self.vae_scale = vae_scale_factor(self.folder)
        if self.params.compile and torch.device(self.device).type == "cuda":
            # On the step's own bound method: the VAE module (maybe shared) is left as it is.
            self.decode = torch.compile(self.decode)

    def latent_layout(self) -> tuple[int, int]:
        """(channels, pixels a side per latent cell) of the latents this step takes: the VAE's, unless the
        model's latents are patched (FLUX.2)."""
        return self.vae.config.latent_channels, self.vae_scale

    def input_limits(self) -> dict:
        _, scale = self.latent_layout()
        return {"latents": (self.params.max_images, None, self.params.max_side // scale, self.params.max_side // scale)}

    def warmup_inputs(self, spec) -> list[dict]:
        return image_warmup.vae_samples(spec, *self.latent_layout())

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """VAE-space latents -> images in [-1, 1], [B, 3, H, W]."""
        return self.vae.decode(z, return_dict=False)[0]

    def to_vae_space(self, latents: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def execute(self, requests: list[Request]) -> list[dict | BaseException]:
        results: list[dict | BaseException | None] = [None] * len(requests)
        channels, scale = self.latent_layout()
        items = []
        for slot, r in enumerate(requests):
            latents = r.get("latents")
            try:
                if latents.shape[0] < 1:
                    raise InvalidInput("latents", f"shape {list(latents.shape)}: no images")
                check_latents("latents", tuple(latents.shape), channels, scale, self.params)
                items.append((slot, latents))
            except InvalidInput as exc:          # this request fails alone
                results[slot] = exc
        for group in group_by(items, lambda it: tuple(it[1].shape[1:])).values():
            try:
                with torch.inference_mode():
                    latents = torch.cat([to_torch(lat, self.device, torch.float32) for _, lat in group])
                    z = self.to_vae_space(latents).to(self.vae.dtype)
                    pixels = to_uint8(self.decode(z))
                for (slot, lat), px in zip(group, pixels.split([lat.shape[0] for _, lat in group])):
                    results[slot] = {"pixels": to_output(px)}
            except Exception as exc:  # noqa: BLE001 - this group fails, the others go on
                for slot, _ in group:
                    results[slot] = exc
        return results
