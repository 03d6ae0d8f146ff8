"""What the models over diffusers' `AutoencoderKLWan` share (Wan2.2, Cosmos3): the latent layout read
from the VAE's config, and the per-channel latent statistics the pipelines normalise with."""
from __future__ import annotations

import torch

from triton_omni.diffusion.checkpoint import component_config


def latent_stats(vae, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, 1 / std) as [1, C, 1, 1, 1] tensors, computed as the Wan pipelines compute them (1 / std
    in float32, then cast)."""
    c = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, c, 1, 1, 1).to(device, dtype)
    inv_std = (1.0 / torch.tensor(vae.config.latents_std).view(1, c, 1, 1, 1)).to(device, dtype)
    return mean, inv_std


def wan_vae_layout(folder) -> tuple[int, int, int]:
    """(latent channels, pixels a side per latent cell, frames per latent frame after the first)."""
    cfg = component_config(folder, "vae")
    return cfg["z_dim"], cfg.get("scale_factor_spatial", 8), cfg.get("scale_factor_temporal", 4)


class WanVae:
    """Mixin of the VAE steps (video/vae.py) over an AutoencoderKLWan pipeline folder."""

    def latent_layout(self) -> tuple[int, int, int]:
        return wan_vae_layout(self.folder)
