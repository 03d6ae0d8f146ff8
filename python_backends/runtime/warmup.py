"""Warmup at load: every instance of a step runs sample requests before its `initialize` returns, so
Triton reports the model ready only once the first calls' costs are paid (lazy imports, a chat
template's compilation, oneDNN / cuBLAS kernel choice per shape, torch.compile of each served size,
an encoder's first frame). The first user request after `ready` then runs as fast as the hundredth.

What to run comes from the YAML (`warmup:` per step or per model; written into config.pbtxt as the
step's `warmup` parameter): batch sizes, and for the steps that take them prompt lengths (`tokens`)
and image sizes (`sizes`). What a sample request looks like is the step's own business
(`Step.warmup_inputs`); a step that returns none is not warmed.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.step import Request, ResponseSink, Step

PARAMETER = "warmup"          # the config.pbtxt parameter (not one of the step's own Params)
REQUEST_ID = "triton-omni-warmup"   # the request id of warmup requests (a step's metrics skip them)
DECOUPLED_TIMEOUT_S = 600.0   # a streaming step's warmup requests must finish within this


@dataclass
class WarmupSpec:
    enabled: bool = True
    batch_sizes: list[int] = field(default_factory=lambda: [1])   # requests run together (clipped to max_batch_size)
    tokens: list[int] = field(default_factory=list)              # prompt lengths (AR and text steps); []: the step's default
    sizes: list[str] = field(default_factory=list)               # "WxH" image sizes (diffusion steps); []: the step's default
    steps: int = 2                                               # denoising steps of a diffusion warmup request
    repeat: int = 2            # passes over it all: some first-call costs take two (a CPU denoise's first two calls)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def parse(cls, raw: Any, where: str = PARAMETER) -> "WarmupSpec":
        """From the YAML's mapping (or `false` to turn warmup off) or config.pbtxt's JSON; ValueError names the key."""
        if isinstance(raw, str):
            raw = json.loads(raw) if raw.strip() else {}
        if raw is None:
            raw = {}
        if isinstance(raw, bool):
            raw = {"enabled": raw}
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: expected a mapping or false, got {raw!r}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        for key in raw:
            if key not in known:
                raise ValueError(f"{where}.{key}: unknown key; allowed: {', '.join(sorted(known))}")
        spec = cls(**raw)
        if not isinstance(spec.enabled, bool):
            raise ValueError(f"{where}.enabled: expected true or false")
        for key in ("batch_sizes", "tokens"):
            values = getattr(spec, key)
            if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                                       for v in values):
                raise ValueError(f"{where}.{key}: expected a list of positive integers, got {values!r}")
        if not isinstance(spec.sizes, list) or not all(isinstance(s, str) and _size(s) for s in spec.sizes):
            raise ValueError(f"{where}.sizes: expected a list of 'WxH' strings, got {spec.sizes!r}")
        for key in ("steps", "repeat"):
            value = getattr(spec, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{where}.{key}: expected a positive integer, got {value!r}")
        return spec

    def image_sizes(self, default: tuple[int, int]) -> list[tuple[int, int]]:
        return [_size(s) for s in self.sizes] or [default]


def _size(text: str) -> tuple[int, int] | None:
    w, sep, h = text.lower().partition("x")
    return (int(w), int(h)) if sep and w.isdigit() and h.isdigit() and int(w) > 0 and int(h) > 0 else None


class _Collect(ResponseSink):
    """A decoupled step's responses to a warmup request: each made into a response (not sent), then
    the final one waited for."""

    def __init__(self, respond):
        self.respond = respond
        self.done = threading.Event()
        self.failure: BaseException | None = None

    def send(self, outputs: dict, final: bool = False) -> None:
        try:
            self.respond(outputs)
        except Exception as exc:  # noqa: BLE001
            self.failure = exc
        if final:
            self.done.set()

    def error(self, exc: BaseException) -> None:
        self.failure = exc
        self.done.set()


def run(step: Step, spec: WarmupSpec, max_batch_size: int, respond=lambda outputs: None) -> str:
    """Run the step's warmup requests at each batch size, `repeat` times; returns what ran, for the
    log. Raises the first failure (the adapter logs it; the model still loads). `respond(outputs)`
    turns each result into what would be sent (the adapter builds the Triton response, unsent)."""
    if not spec.enabled:
        return "off"
    samples = samples_of(step, spec)
    if not samples:
        return "no warmup inputs for this step"
    sizes = sorted({min(b, max_batch_size) if max_batch_size > 0 else 1 for b in spec.batch_sizes})
    start, runs = time.monotonic(), 0
    for _ in range(spec.repeat):
        for sample in samples:
            for n in sizes:
                requests = [request(sample, i) for i in range(n)]
                if step.decoupled:
                    _submit_all(step, requests, respond)
                else:
                    for result in step.execute(requests):
                        if isinstance(result, BaseException):
                            raise result
                        respond(result)
                runs += n
    return f"{runs} requests ({len(samples)} samples x batch sizes {sizes} x {spec.repeat}) in " \
           f"{time.monotonic() - start:.2f} s"


def samples_of(step: Step, spec: WarmupSpec) -> list[dict]:
    return [check_sample(step, s) for s in step.warmup_inputs(spec)] if spec.enabled else []


def request(sample: dict, i: int = 0) -> Request:
    return Request(dict(sample), request_id=f"{REQUEST_ID}-{i}")


def is_warmup(request_id: str) -> bool:
    """Whether a request is one of the warmup's (a streaming step may finish it after the warmup returned)."""
    return request_id.startswith(REQUEST_ID)


def _submit_all(step: Step, requests: list[Request], respond) -> None:
    sinks = [_Collect(respond) for _ in requests]
    for request, sink in zip(requests, sinks):
        step.submit(request, sink)
    deadline = time.monotonic() + DECOUPLED_TIMEOUT_S
    for sink in sinks:
        if not sink.done.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"a warmup request got no final response in {DECOUPLED_TIMEOUT_S:.0f} s")
        if sink.failure is not None:
            raise sink.failure


def check_sample(step: Step, sample: dict) -> dict:
    """A sample's tensors must be inputs of the step (a misspelt name would silently warm nothing)."""
    names = {t.name for t in step.inputs}
    unknown = sorted(set(sample) - names)
    if unknown:
        raise InvalidInput(unknown[0], f"not an input of step {step.step_name!r}")
    return sample
