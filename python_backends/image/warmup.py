"""Warmup requests of the shared image steps (runtime/warmup.py runs them at load): one per served
size of the YAML's warmup spec (`sizes`), with and without classifier-free guidance where a step
batches the two differently. Random values of the right shapes: what costs on a first call is the
shape (kernel choice, torch.compile), not the numbers."""
from __future__ import annotations

import numpy as np

from triton_omni.runtime.step import string_array

FALLBACK_SIZE = (256, 256)        # when the spec names no size (a step has no served default of its own)
PROMPT_TOKENS = 32                # text-embedding rows of a warmup prompt


def _i32(v) -> np.ndarray:
    return np.array([v], dtype=np.int32)


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def settings(width: int, height: int, steps: int, guidance: float) -> dict:
    return {"width": _i32(width), "height": _i32(height), "num_inference_steps": _i32(steps),
            "guidance_scale": np.array([guidance], np.float32), "seed": np.array([0], np.int64), "n": _i32(1)}


def pre_samples(spec, default_size: str) -> list[dict]:
    w, _, h = default_size.lower().partition("x")
    return [{"prompt": string_array("a warm-up picture"), "negative_prompt": string_array("blur"),
             "size": string_array(f"{w}x{h}"), "num_inference_steps": _i32(spec.steps)}
            for w, h in spec.image_sizes((int(w), int(h)))]


def text_encoder_samples(vocab: int, length: int) -> list[dict]:
    """One prompt, then a prompt and its negative (the pre step pads every row to `length`)."""
    out = []
    for rows in (1, 2):
        mask = np.zeros((rows, length), np.int32)
        mask[:, :min(PROMPT_TOKENS, length)] = 1
        out.append({"text_ids": _rng().integers(0, vocab, (rows, length), dtype=np.int32), "text_mask": mask})
    return out


def denoise_samples(spec, text_dim: int) -> list[dict]:
    """Each size without guidance and with it (the unconditional rows double the model's batch)."""
    embeds = _rng().standard_normal((PROMPT_TOKENS, text_dim), dtype=np.float32)
    out = []
    for w, h in spec.image_sizes(FALLBACK_SIZE):
        for negative, guidance in ((embeds[:0], 1.0), (embeds, 4.0)):
            out.append({"prompt_embeds": embeds, "negative_embeds": negative, **settings(w, h, spec.steps, guidance)})
    return out


def vae_samples(spec, channels: int, scale: int) -> list[dict]:
    return [{"latents": _rng().standard_normal((1, channels, h // scale, w // scale), dtype=np.float32)}
            for w, h in spec.image_sizes(FALLBACK_SIZE)]


def encode_samples(spec, formats) -> list[dict]:
    return [{"pixels": _rng().integers(0, 256, (1, h, w, 3), dtype=np.uint8), "output_format": string_array(fmt)}
            for w, h in spec.image_sizes(FALLBACK_SIZE) for fmt in formats]
