"""The base class of every step model, the request view it gets, and the step registry.

A step declares its tensors (`inputs`, `outputs`), its typed parameters (`Params`) and whether it
streams (`decoupled`). The converter reads those declarations to write config.pbtxt; the Triton
adapter (`triton_model.py`) turns Triton requests into `Request`s and results into responses.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np

from triton_omni.runtime.errors import InvalidInput
from triton_omni.runtime.spec import TensorSpec

STEPS: dict[str, type["Step"]] = {}


def register(name: str) -> Callable[[type["Step"]], type["Step"]]:
    """Register a step class under the name that ensemble YAML files use (`step: <name>`)."""

    def wrap(cls: type[Step]) -> type[Step]:
        if name in STEPS and STEPS[name] is not cls:
            raise ValueError(f"step name {name!r} registered twice")
        cls.step_name = name
        STEPS[name] = cls
        return cls

    return wrap


@dataclass
class NoParams:
    pass


@dataclass
class StepContext:
    model_name: str
    params: Any                    # an instance of the step's Params dataclass
    device: str                    # "cpu" or "cuda:N"
    base_dir: Path                 # relative paths in parameters resolve against this
    max_batch_size: int = 0
    log: Callable[[str], None] = print

    def path(self, value: str) -> Path:
        p = Path(value).expanduser()
        return p if p.is_absolute() else (self.base_dir / p).resolve()

    def checkpoint(self, value: str) -> Path:
        """A checkpoint folder from a parameter; a clear error if it is not there."""
        p = self.path(value)
        markers = ("config.json", "tokenizer_config.json", "model_index.json")   # transformers / diffusers
        if not value or not any((p / m).exists() for m in markers):
            raise FileNotFoundError(f"{self.model_name}: checkpoint folder {str(p)!r} (parameter 'checkpoint') "
                                    f"has none of {', '.join(markers)}; build it or pass --checkpoint NAME=DIR "
                                    "to the converter")
        return p


class Request:
    """One request's inputs, with the batch dimension removed (one item per request)."""

    def __init__(self, tensors: dict[str, Any], request_id: str = "", cancelled: Callable[[], bool] | None = None):
        self.tensors = tensors
        self.request_id = request_id
        self._cancelled = cancelled

    def is_cancelled(self) -> bool:
        return bool(self._cancelled and self._cancelled())

    def get(self, name: str):
        return self.tensors.get(name)

    def string(self, name: str, default: str | None = None) -> str | None:
        value = self.get(name)
        if value is None:
            return default
        if value.size != 1:
            raise InvalidInput(name, f"expected one string, got {value.size}")
        raw = value.reshape(-1)[0]
        if isinstance(raw, str):
            return raw
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidInput(name, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None

    def json(self, name: str, default: Any = None) -> Any:
        text = self.string(name)
        if text is None or not text.strip():
            return default
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidInput(name, f"not valid JSON: {e.msg} at position {e.pos}") from None

    def scalar(self, name: str, default: Any = None) -> Any:
        value = self.get(name)
        if value is None:
            return default
        if value.size != 1:
            raise InvalidInput(name, f"expected one value, got shape {list(value.shape)}")
        return value.reshape(-1)[0].item()


class ResponseSink:
    """Where a decoupled step sends a request's responses (the adapter wraps Triton's sender)."""

    def send(self, outputs: dict[str, Any], final: bool = False) -> None:
        raise NotImplementedError

    def error(self, exc: BaseException) -> None:
        raise NotImplementedError

    def is_cancelled(self) -> bool:
        return False


class Step:
    """Base of all step models. Subclasses set the class attributes and implement one of
    `one` (a request in, its outputs out), `execute` (a batch in, one result or exception per
    request out: for steps that batch) or, when `decoupled`, `submit` (start a request; stream its
    responses to the sink from any thread)."""

    step_name: ClassVar[str] = ""
    inputs: ClassVar[tuple[TensorSpec, ...]] = ()
    outputs: ClassVar[tuple[TensorSpec, ...]] = ()
    decoupled: ClassVar[bool] = False
    Params: ClassVar[type] = NoParams

    def __init__(self, ctx: StepContext):
        self.ctx = ctx
        self.params = ctx.params

    def execute(self, requests: list[Request]) -> list[dict[str, Any] | BaseException]:
        """Default: each request through `one` on its own; whatever it raises becomes that request's
        error (InvalidInput -> INVALID_ARG), never its neighbours'. Steps that batch override this."""
        results: list[dict[str, Any] | BaseException] = []
        for req in requests:
            try:
                results.append(self.one(req))
            except Exception as exc:  # noqa: BLE001 - one request's failure stays its own
                results.append(exc)
        return results

    def execute_jobs(self, requests: list[Request], run: Callable) -> list[dict[str, Any] | BaseException]:
        """For steps that batch: `self.job(request)` for each request (one that cannot make its job fails
        alone), then one `run(requests, jobs)` for the rest, yielding each one's outputs in order; if that
        raises, those requests fail with it."""
        results: list[dict[str, Any] | BaseException | None] = [None] * len(requests)
        slots, jobs = [], []
        for slot, req in enumerate(requests):
            try:
                jobs.append(self.job(req))
                slots.append(slot)
            except Exception as exc:  # noqa: BLE001 - this request fails, the others go on
                results[slot] = exc
        if jobs:
            try:
                for slot, outputs in zip(slots, run([requests[s] for s in slots], jobs)):
                    results[slot] = outputs
            except Exception as exc:  # noqa: BLE001 - the batched call failed: its requests fail together
                for slot in slots:
                    results[slot] = exc
        return results

    def input_limits(self) -> dict[str, tuple[int | None, ...]]:
        """The most entries one request may send along each dimension of an input, from this step's
        parameters (e.g. a codec's frames from its longest audio). The adapter refuses a larger
        request with INVALID_ARG naming the input before the step sees it; None leaves a dimension free."""
        return {}

    def warmup_inputs(self, spec) -> list[dict[str, Any]]:
        """Sample requests that warm this step up at load (runtime/warmup.py runs each at the spec's
        batch sizes): one request's tensors each, without the batch dimension. [] (the default): none."""
        return []

    def one(self, request: Request) -> dict[str, Any]:
        raise NotImplementedError

    def submit(self, request: Request, sink: ResponseSink) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    @classmethod
    def default_params(cls) -> dict[str, Any]:
        return {f.name: getattr(cls.Params(), f.name) for f in dataclasses.fields(cls.Params)}


def string_array(texts: list[str] | str) -> np.ndarray:
    """A TYPE_STRING output: numpy object array of UTF-8 bytes."""
    if isinstance(texts, str):
        texts = [texts]
    return np.array([t.encode("utf-8") for t in texts], dtype=np.object_)
