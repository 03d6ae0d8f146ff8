"""Sampling parameters of a request, and the batched sampler.

Randomness comes from a counter-based hash of (seed, output position, vocab index) turned into
Gumbel noise, so a seeded request draws the same tokens whatever else shares its batch, and the
whole batch samples in a few tensor ops on the device (no per-request generators, no host sync).
The names follow vLLM's SamplingParams (what Triton's vLLM backend takes in `sampling_parameters`):
penalties, `min_p`, `logit_bias`, `n`, `logprobs` (the number of top alternatives per token) and
`guided_decoding` (structured output: see ar/grammar.py). ar/logits_processors.py applies them.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from triton_omni.runtime.errors import InvalidInput

FIELD = "sampling_parameters"


@dataclass
class SamplingParams:
    max_tokens: int | None = None      # None: the rest of the context
    min_tokens: int = 0                # stop tokens (and EOS) are ignored before this many
    temperature: float = 1.0           # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0                     # 0 or -1: off
    seed: int | None = None            # None: a random seed is drawn
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_p: float = 0.0                 # drop tokens below min_p x the top token's probability
    presence_penalty: float = 0.0      # OpenAI's: minus this for every token already generated
    frequency_penalty: float = 0.0     # ... minus this times its count
    repetition_penalty: float = 1.0    # transformers' / vLLM's: prompt and generated tokens' logits / p (x p if < 0)
    logit_bias: dict[str, float] | None = None     # token id (as a string, JSON's keys) -> added to its logit
    n: int = 1                         # samples of the prompt (prefilled once, its blocks shared)
    logprobs: int | None = None        # None: none; k: the chosen token's logprob and the k most likely
    guided_decoding: dict | None = None             # {json | regex | choice | json_object | grammar}: ar/grammar.py
    thinking_budget: int | None = None  # reasoning tokens at most, then the end of reasoning is forced

    MAX_LOGIT_BIAS = 300               # entries (OpenAI's limit)
    MAX_TOP_LOGPROBS = 20              # OpenAI's limit
    MAX_N = 16

    @classmethod
    def from_dict(cls, raw: Any, defaults: "SamplingParams | None" = None) -> "SamplingParams":
        """A request's parameters over `defaults` (a checkpoint's generation_config: ar/defaults.py)."""
        if raw is None:
            return dataclasses.replace(defaults) if defaults is not None else cls()
        if not isinstance(raw, dict):
            raise InvalidInput(FIELD, f"expected a JSON object, got {type(raw).__name__}")
        known = {f.name for f in dataclasses.fields(cls)} | {"structured_outputs"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise InvalidInput(FIELD, f"unknown key {unknown[0]!r}; known keys: {', '.join(sorted(known))}")
        p = defaults if defaults is not None else cls()
        p = dataclasses.replace(p, stop=list(p.stop), stop_token_ids=list(p.stop_token_ids))
        if "structured_outputs" in raw:        # vLLM's newer name of guided_decoding
            raw = {**{k: v for k, v in raw.items() if k != "structured_outputs"}, "guided_decoding": raw["structured_outputs"]}
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
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidInput(f"{FIELD}.min_p", f"must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise InvalidInput(f"{FIELD}.{name}", f"must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise InvalidInput(f"{FIELD}.repetition_penalty", f"must be in (0, 2], got {self.repetition_penalty}")
        if not 1 <= self.n <= self.MAX_N:
            raise InvalidInput(f"{FIELD}.n", f"must be in [1, {self.MAX_N}], got {self.n}")
        if self.logprobs is not None and not 0 <= self.logprobs <= self.MAX_TOP_LOGPROBS:
            raise InvalidInput(f"{FIELD}.logprobs", f"must be in [0, {self.MAX_TOP_LOGPROBS}], got {self.logprobs}")
        if self.thinking_budget is not None and self.thinking_budget < 0:
            raise InvalidInput(f"{FIELD}.thinking_budget", f"must be >= 0, got {self.thinking_budget}")
        self._check_logit_bias()
        if self.guided_decoding is not None and not isinstance(self.guided_decoding, dict):
            raise InvalidInput(f"{FIELD}.guided_decoding", "expected an object (json, regex, choice, json_object or grammar)")

    def _check_logit_bias(self) -> None:
        name = f"{FIELD}.logit_bias"
        if self.logit_bias is None:
            return
        if not isinstance(self.logit_bias, dict) or len(self.logit_bias) > self.MAX_LOGIT_BIAS:
            raise InvalidInput(name, f"expected an object of at most {self.MAX_LOGIT_BIAS} token id -> bias entries")
        clean = {}
        for key, value in self.logit_bias.items():
            if not str(key).isdigit() or isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not -100 <= value <= 100:
                raise InvalidInput(name, f"entry {str(key)[:20]!r}: expected a token id and a bias in [-100, 100]")
            clean[str(int(key))] = float(value)
        self.logit_bias = clean

    @property
    def needs_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def resolve(self, prompt_len: int, max_model_len: int, vocab_size: int) -> "SamplingParams":
        """Check against the prompt and context; fill max_tokens and seed. Returns a new object."""
        room = self.check_fits(prompt_len, max_model_len)
        if any(t >= vocab_size for t in self.stop_token_ids):
            raise InvalidInput(f"{FIELD}.stop_token_ids", f"token ids must be < {vocab_size}")
        if self.logit_bias and max(int(k) for k in self.logit_bias) >= vocab_size:
            raise InvalidInput(f"{FIELD}.logit_bias", f"token ids must be < {vocab_size}")
        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(4), "little")
        # no max_tokens: the rest of the context (as vLLM); the engine reserves those blocks up front
        max_tokens = self.max_tokens if self.max_tokens is not None else room
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
          "ignore_eos": bool, "min_p": float, "presence_penalty": float, "frequency_penalty": float,
          "repetition_penalty": float, "n": int, "logprobs": int, "thinking_budget": int}
_NULLABLE = ("max_tokens", "seed", "logprobs", "thinking_budget", "logit_bias", "guided_decoding")


def _check_type(key: str, value: Any) -> Any:
    name = f"{FIELD}.{key}"
    if key in _NULLABLE and value is None:
        return None
    if key in ("logit_bias", "guided_decoding"):
        if isinstance(value, str):              # the vLLM backend's clients send nested objects as JSON text
            try:
                value = json.loads(value)
            except ValueError:
                raise InvalidInput(name, "expected an object") from None
        if isinstance(value, dict):
            return value
        raise InvalidInput(name, "expected an object")
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
        if isinstance(value, str) and value.lower() in ("true", "false"):      # "true" from string-valued clients
            return value.lower() == "true"
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
           seeds: torch.Tensor, steps: torch.Tensor, use_top_k: bool, use_top_p: bool,
           min_p: torch.Tensor | None = None) -> torch.Tensor:
    """Next token per row. logits [B, V] (fp32); per-row parameters [B]. Greedy where temperature == 0.
    `use_top_k` / `use_top_p` say whether any row needs them (known on the host at scheduling time);
    `min_p` [B] (None: off): drop tokens whose probability is below min_p x the top one's, i.e. whose
    tempered logit is below the top's + log(min_p) (the same set whatever top-k / top-p keep)."""
    logits = logits.float()
    greedy = logits.argmax(-1)
    x = logits / temperature.clamp(min=1e-5)[:, None]
    if min_p is not None:
        floor = x.max(-1, keepdim=True).values + torch.log(min_p.clamp(min=1e-30))[:, None]
        x = torch.where((x < floor) & (min_p > 0)[:, None], float("-inf"), x)
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
