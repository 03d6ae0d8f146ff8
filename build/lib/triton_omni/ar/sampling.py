"""Sampling parameters of a request, and the batched sampler.

Randomness comes from a counter-based hash of (seed, output position, vocab index) turned into
Gumbel noise, so a seeded request draws the same tokens whatever else shares its batch, and the
whole batch samples in a few tensor ops on the device (no per-request generators, no host sync).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from triton_omni.runtime.errors import InvalidInput

FIELD = "sampling_parameters"


@dataclass
class SamplingParams:
    max_tokens: int | None = None      # None: up to DEFAULT_MAX_TOKENS, within the context
    min_tokens: int = 0                # stop tokens (and EOS) are ignored before this many
    temperature: float = 1.0           # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0                     # 0 or -1: off
    seed: int | None = None            # None: a random seed is drawn
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    DEFAULT_MAX_TOKENS = 256

    @classmethod
    def from_dict(cls, raw: Any) -> "SamplingParams":
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise InvalidInput(FIELD, f"expected a JSON object, got {type(raw).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise InvalidInput(FIELD, f"unknown key {unknown[0]!r}; known keys: {', '.join(sorted(known))}")
        p = cls()
        for key, value in raw.items():
            setattr(p, key, _check_type(key, value))
        if isinstance(p.stop, str):
            p.stop = [p.stop]
        p._check_ranges()
        return p

    def _check_ranges(self) -> None:
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise InvalidInput(f"{FIELD}.max_tokens", f"must be > 0, got {self.max_tokens}")
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            raise InvalidInput(f"{FIELD}.min_tokens", f"must be in [0, max_tokens], got {self.min_tokens}")
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidInput(f"{FIELD}.temperature", f"must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidInput(f"{FIELD}.top_p", f"must be in (0, 1], got {self.top_p}")
        if not -1 <= self.top_k < 2 ** 31:
            raise InvalidInput(f"{FIELD}.top_k", f"must be -1, 0 (off) or > 0 (below 2^31), got {self.top_k}")
        if self.seed is not None and not -2 ** 63 <= self.seed < 2 ** 63:
            raise InvalidInput(f"{FIELD}.seed", f"must fit in 64 bits (signed), got {self.seed}")
        if any(s == "" for s in self.stop):
            raise InvalidInput(f"{FIELD}.stop", "stop strings must not be empty")
        if len(self.stop_token_ids) > 8:
            raise InvalidInput(f"{FIELD}.stop_token_ids", "at most 8 stop token ids")
        if any(t < 0 for t in self.stop_token_ids):
            raise InvalidInput(f"{FIELD}.stop_token_ids", "token ids must be >= 0")

    def resolve(self, prompt_len: int, max_model_len: int, vocab_size: int) -> "SamplingParams":
        """Check against the prompt and context; fill max_tokens and seed. Returns a new object."""
        room = self.check_fits(prompt_len, max_model_len)
        if any(t >= vocab_size for t in self.stop_token_ids):
            raise InvalidInput(f"{FIELD}.stop_token_ids", f"token ids must be < {vocab_size}")
        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(4), "little")
        max_tokens = self.max_tokens if self.max_tokens is not None else min(self.DEFAULT_MAX_TOKENS, room)
        return dataclasses.replace(self, max_tokens=max_tokens, seed=seed)

    def check_fits(self, prompt_len: int, max_model_len: int) -> int:
        """The room the context leaves after the prompt; raises when the prompt or max_tokens does not fit."""
        room = max_model_len - prompt_len
        if prompt_len == 0:
            raise InvalidInput("prompt", "is empty")
        if room <= 0:
            raise InvalidInput("prompt", f"has {prompt_len} tokens; the context holds {max_model_len}")
        if self.max_tokens is not None and self.max_tokens > room:
            raise InvalidInput(f"{FIELD}.max_tokens", f"{self.max_tokens} does not fit: the prompt has "
                               f"{prompt_len} tokens and the context holds {max_model_len}")
        return room

    @property
    def resolved(self) -> bool:
        """max_tokens and seed filled in (by `resolve`)."""
        return self.max_tokens is not None and self.seed is not None

    @classmethod
    def from_resolved(cls, raw: dict | None) -> "SamplingParams":
        """The `sampling` tensor a pre step wrote (`resolve(...).to_dict()`): resolved there, once, so
        not resolved again. Its keys and ranges are still checked (the same checks, a few dozen
        operations): any step can be called directly, and a bad value that reached the engine would
        fail the whole decode batch, not this request. None (a request sent straight to the AR step
        without one): the defaults, which the engine resolves."""
        return cls.from_dict(raw)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_TYPES = {"max_tokens": int, "min_tokens": int, "temperature": float, "top_p": float, "top_k": int, "seed": int,
          "ignore_eos": bool}


def _check_type(key: str, value: Any) -> Any:
    name = f"{FIELD}.{key}"
    if key in ("max_tokens", "seed") and value is None:
        return None
    if key == "stop":
        if isinstance(value, str) or (isinstance(value, list) and all(isinstance(s, str) for s in value)):
            return value
        raise InvalidInput(name, "expected a string or a list of strings")
    if key == "stop_token_ids":
        if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            return value
        raise InvalidInput(name, "expected a list of integers")
    want = _TYPES[key]
    if isinstance(value, str) and want in (int, float):
        # genai-perf and the vLLM backend's clients send numbers as strings ("16")
        try:
            value = want(value)
        except ValueError:
            raise InvalidInput(name, f"expected {want.__name__}, got {value!r}") from None
    if want is bool:
        if isinstance(value, bool):
            return value
    elif want is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InvalidInput(name, f"expected {want.__name__}, got {value!r}")


# --- the sampler ---------------------------------------------------------------------------------
_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 lanes (every product stays below 2^63)."""
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    return (x >> 16) ^ x


def gumbel_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [B, V], a pure function of (seed, step, vocab index)."""
    key = _mix32(_mix32(seeds & _MASK32) ^ ((seeds >> 32) & _MASK32))
    key = _mix32(key ^ (steps * 0x27D4EB2F & _MASK32))
    idx = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    h = _mix32(key[:, None] ^ ((idx * 0x9E3779B1) & _MASK32)[None, :])
    u = ((h >> 8).float() + 0.5) * (1.0 / (1 << 24))           # uniform in (0, 1)
    return -torch.log(-torch.log(u))


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           seeds: torch.Tensor, steps: torch.Tensor, use_top_k: bool, use_top_p: bool) -> torch.Tensor:
    """Next token per row. logits [B, V] (fp32); per-row parameters [B]. Greedy where temperature == 0.
    `use_top_k` / `use_top_p` say whether any row needs them (known on the host at scheduling time)."""
    logits = logits.float()
    greedy = logits.argmax(-1)
    x = logits / temperature.clamp(min=1e-5)[:, None]
    if use_top_k or use_top_p:
        sorted_x, order = x.sort(-1, descending=True)
        drop = torch.zeros_like(sorted_x, dtype=torch.bool)
        if use_top_k:
            ranks = torch.arange(x.shape[-1], device=x.device)[None, :]
            k = torch.where(top_k > 0, top_k, x.shape[-1])
            drop |= ranks >= k[:, None]
        if use_top_p:
            probs = sorted_x.masked_fill(drop, float("-inf")).softmax(-1)
            drop |= (probs.cumsum(-1) - probs) > top_p[:, None]       # always keeps the top token
        x = torch.empty_like(x).scatter_(-1, order, sorted_x.masked_fill(drop, float("-inf")))
    sampled = (x + gumbel_noise(seeds, steps, x.shape[-1])).argmax(-1)
    return torch.where(temperature == 0, greedy, sampled)
