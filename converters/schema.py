"""The ensemble YAML schema: typed, validated on load, errors naming the file, key and reason.

An ensemble YAML says how a model is served: which registered steps, in which order, with which
instances, batching and parameters. What each step reads and writes is declared by the step class
itself (python_backends), so tensors are wired by name: a step input comes from the latest earlier
step output of that name, else it becomes an input of the ensemble.

    name: qwen3_chat                     # the ensemble's model name; steps are <name>_<key>
    description: ...
    max_batch_size: 8
    checkpoint: checkpoints/tiny/qwen3   # given to every step that has a `checkpoint` parameter
    outputs: [text_output, finish_reason]
    steps:
      - key: pre
        step: chat_pre                   # a name registered with @register
        instances: {kind: cpu, count: 1} # kind gpu -> KIND_GPU when building for a GPU target;
                                         # count: an int or {cpu: N, gpu: M}
        batching: {max_queue_delay_us: 500}   # also max_queue_size, default_timeout_us: Triton's queue policy
        parameters: {max_model_len: 2048, dtype: {cpu: float32, gpu: bfloat16}}
        warmup: {batch_sizes: {cpu: [1], gpu: [1, 8]}}   # runtime/warmup.py's WarmupSpec; a model-level
                                         # `warmup:` applies to every step, a step's own keys win
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from triton_omni.runtime.params import field_types, format_value, parse_value
from triton_omni.runtime.step import STEPS, Step
from triton_omni.runtime.warmup import WarmupSpec

TARGETS = ("cpu", "gpu")


class ConfigError(ValueError):
    def __init__(self, file: str | Path, key: str, reason: str):
        super().__init__(f"{file}: {key}: {reason}")


@dataclass
class Batching:
    max_queue_delay_us: int = 0
    preferred_batch_sizes: list[int] = field(default_factory=list)
    # Triton's queue policy for the step: past `max_queue_size` queued requests a new one is refused at once
    # (UNAVAILABLE; the proxy answers 429 with Retry-After); a request queued longer than its timeout
    # (`default_timeout_us`, or the client's own when `allow_timeout_override`) is refused too. 0: no bound.
    max_queue_size: int = 0
    default_timeout_us: int = 0
    allow_timeout_override: bool = True


@dataclass
class StepConfig:
    key: str
    step: str
    kind: str = "cpu"                   # "cpu" or "gpu"
    count: Any = 1                      # instances: an int or {cpu: N, gpu: M}
    max_batch_size: int | None = None   # default: the ensemble's
    batching: Batching | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    inputs_from: dict[str, str] = field(default_factory=dict)   # step input -> ensemble tensor name
    outputs_as: dict[str, str] = field(default_factory=dict)    # step output -> ensemble tensor name
    warmup: dict[str, Any] = field(default_factory=dict)       # WarmupSpec keys; values may be {cpu: X, gpu: Y}

    @property
    def cls(self) -> type[Step]:
        return STEPS[self.step]

    def instance_count(self, target: str) -> int:
        return per_target(self.count, target)


def per_target(value: Any, target: str) -> int:
    """A count given as an int or as {cpu: N, gpu: M}, for one build target."""
    return int(value[target] if isinstance(value, dict) else value)


def warmup_spec(raw: dict[str, Any], target: str) -> WarmupSpec:
    """A YAML warmup mapping (per-target values resolved) as the spec a step gets; ValueError names the key."""
    return WarmupSpec.parse({k: v[target] if isinstance(v, dict) else v for k, v in raw.items()})


def _check_warmup(file, key: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if value is False:
        return {"enabled": False}
    _expect(file, key, value, dict, "a mapping or false")
    for k, v in value.items():
        if isinstance(v, dict) and set(v) != set(TARGETS):
            raise ConfigError(file, f"{key}.{k}", "a per-target value needs exactly the keys cpu and gpu")
    for target in TARGETS:
        try:
            warmup_spec(value, target)
        except (ValueError, TypeError) as e:
            raise ConfigError(file, key, str(e)) from None
    return value


def _check_hub(file, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    _expect(file, "hub", value, dict, "a mapping")
    _only_keys(file, "hub", value, {"repos", "allow_patterns"})
    for key in ("repos", "allow_patterns"):
        items = value.get(key, [])
        if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
            raise ConfigError(file, f"hub.{key}", f"expected a list of strings, got {items!r}")
    return value


def _check_count(file, key: str, value: Any) -> Any:
    counts = value if isinstance(value, dict) else {t: value for t in TARGETS}
    if set(counts) != set(TARGETS) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                               for n in counts.values()):
        raise ConfigError(file, key, f"expected a positive integer or {{cpu: N, gpu: M}}, got {value!r}")
    return value


@dataclass
class EnsembleConfig:
    name: str
    source: Path
    description: str = ""
    max_batch_size: int = 8
    checkpoint: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)   # given to every step that has them
    outputs: list[str] = field(default_factory=list)
    steps: list[StepConfig] = field(default_factory=list)
    openai: dict[str, Any] = field(default_factory=dict)      # how the OpenAI proxy exposes it
    # processes of a streaming ensemble's front (python_backends/runtime/front.py): one front relays
    # every response of its streams through one lock (the stub is not thread-safe). H200, qwen3_chat
    # 0.6B shape, c=64: 3.3k streamed tokens/s with 1 front, 5.7k with 4, 7.6-8.1k with 8, 9.7-9.9k
    # with 16 (11.1-11.3k with the chat YAMLs' GPU stream_interval 0; 18.2k once that sent 33 tokens a
    # response at 64 streams, results/ar_decode.md), 13.6k calling the ensemble without a front.
    # Triton spreads requests over idle instances. An int or {cpu: N, gpu: M}.
    front_instances: Any = field(default_factory=lambda: {"cpu": 1, "gpu": 16})
    warmup: dict[str, Any] = field(default_factory=dict)      # every step's warmup defaults (StepConfig.warmup)
    # the released Hugging Face repositories (`repos`, for the README) and which of their files the model
    # loads (`allow_patterns`, for `--checkpoint NAME=hf:ORG/REPO`; default: converters/hub.py's)
    hub: dict[str, Any] = field(default_factory=dict)
    # "unbatched": the front takes one request per call with inputs of shape [1] and no batch
    # dimension (max_batch_size 0), as Triton's vLLM backend models do, so that backend's clients and
    # genai-perf's vLLM mode call it unchanged; "batched" (default): [1, ...] like every step
    front_shape: str = "batched"

    def front_count(self, target: str) -> int:
        return per_target(self.front_instances, target)

    def model_name(self, step: StepConfig) -> str:
        return f"{self.name}_{step.key}"

    def warmup_spec(self, step: StepConfig, target: str) -> WarmupSpec:
        return warmup_spec({**self.warmup, **step.warmup}, target)

    def resolved_parameters(self, step: StepConfig, target: str) -> dict[str, str]:
        """The step's parameters for a target, as config.pbtxt strings (defaults filled in)."""
        values = step.cls.default_params()
        if self.checkpoint is not None and "checkpoint" in values:
            values["checkpoint"] = self.checkpoint
        shared = {k: v for k, v in self.parameters.items() if k in values}
        for k, v in {**shared, **step.parameters}.items():
            values[k] = v[target] if isinstance(v, dict) else v
        return {k: format_value(v) for k, v in values.items()}


def _expect(file, key, value, typ, what):
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ConfigError(file, key, f"expected {what}, got {value!r}")
    return value


def _only_keys(file, key, mapping, allowed):
    unknown = sorted(set(mapping) - set(allowed))
    if unknown:
        raise ConfigError(file, f"{key}.{unknown[0]}" if key else unknown[0],
                          f"unknown key; allowed: {', '.join(sorted(allowed))}")


def _parse_step(file, i: int, raw: Any) -> StepConfig:
    where = f"steps[{i}]"
    _expect(file, where, raw, dict, "a mapping")
    _only_keys(file, where, raw, {f.name for f in dataclasses.fields(StepConfig)} | {"instances"})
    for required in ("key", "step"):
        if required not in raw:
            raise ConfigError(file, f"{where}.{required}", "missing")
    key = _expect(file, f"{where}.key", raw["key"], str, "a string")
    where = f"steps.{key}"
    name = _expect(file, f"{where}.step", raw["step"], str, "a string")
    if name not in STEPS:
        raise ConfigError(file, f"{where}.step", f"no step registered as {name!r}; known: {', '.join(sorted(STEPS))}")
    inst = raw.get("instances", {})
    _expect(file, f"{where}.instances", inst, dict, "a mapping")
    _only_keys(file, f"{where}.instances", inst, {"kind", "count"})
    kind = inst.get("kind", "cpu")
    if kind not in TARGETS:
        raise ConfigError(file, f"{where}.instances.kind", f"expected cpu or gpu, got {kind!r}")
    count = _check_count(file, f"{where}.instances.count", inst.get("count", 1))
    batching = None
    if raw.get("batching") is not None:
        b = _expect(file, f"{where}.batching", raw["batching"], dict, "a mapping")
        _only_keys(file, f"{where}.batching", b, {f.name for f in dataclasses.fields(Batching)})
        batching = Batching(
            _expect(file, f"{where}.batching.max_queue_delay_us", b.get("max_queue_delay_us", 0), int, "an integer"),
            list(_expect(file, f"{where}.batching.preferred_batch_sizes", b.get("preferred_batch_sizes", []), list, "a list")),
            *(_non_negative(file, f"{where}.batching.{k}", b.get(k, 0)) for k in ("max_queue_size", "default_timeout_us")),
            _expect(file, f"{where}.batching.allow_timeout_override", b.get("allow_timeout_override", True), bool, "true or false"))
    step = StepConfig(key=key, step=name, kind=kind, count=count, batching=batching,
                      max_batch_size=raw.get("max_batch_size"),
                      parameters=_expect(file, f"{where}.parameters", raw.get("parameters", {}) or {}, dict, "a mapping"),
                      inputs_from=_expect(file, f"{where}.inputs_from", raw.get("inputs_from", {}) or {}, dict, "a mapping"),
                      outputs_as=_expect(file, f"{where}.outputs_as", raw.get("outputs_as", {}) or {}, dict, "a mapping"),
                      warmup=_check_warmup(file, f"{where}.warmup", raw.get("warmup")))
    if step.max_batch_size is not None:
        _expect(file, f"{where}.max_batch_size", step.max_batch_size, int, "an integer")
    if step.cls.decoupled and batching is not None:
        raise ConfigError(file, f"{where}.batching", "a decoupled (streaming) step batches inside its engine")
    _check_parameters(file, where, step)
    return step


def _check_parameters(file, where: str, step: StepConfig) -> None:
    types = field_types(step.cls.Params)
    for k, v in step.parameters.items():
        key = f"{where}.parameters.{k}"
        if k not in types:
            raise ConfigError(file, key, f"step {step.step!r} has no such parameter; known: {', '.join(sorted(types))}")
        per_target = v if isinstance(v, dict) else {t: v for t in TARGETS}
        if isinstance(v, dict) and set(v) != set(TARGETS):
            raise ConfigError(file, key, "a per-target value needs exactly the keys cpu and gpu")
        for target, value in per_target.items():
            try:
                parse_value(k, format_value(value), types[k])
            except (ValueError, TypeError) as e:
                raise ConfigError(file, key, str(e)) from None


def load_ensemble(path: str | Path) -> EnsembleConfig:
    import triton_omni.steps  # noqa: F401 - registers every step class

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(path, "<yaml>", f"not valid YAML: {e}") from None
    _expect(path, "<top>", raw, dict, "a mapping")
    allowed = {f.name for f in dataclasses.fields(EnsembleConfig)} - {"source"}
    _only_keys(path, "", raw, allowed)
    if "name" not in raw:
        raise ConfigError(path, "name", "missing")
    name = _expect(path, "name", raw["name"], str, "a string")
    if name != path.stem:
        raise ConfigError(path, "name", f"must match the file name ({path.stem!r})")
    steps_raw = _expect(path, "steps", raw.get("steps"), list, "a list of steps")
    if not steps_raw:
        raise ConfigError(path, "steps", "needs at least one step")
    cfg = EnsembleConfig(
        name=name, source=path,
        description=_expect(path, "description", raw.get("description", ""), str, "a string"),
        max_batch_size=_expect(path, "max_batch_size", raw.get("max_batch_size", 8), int, "an integer"),
        checkpoint=raw.get("checkpoint"),
        parameters=_expect(path, "parameters", raw.get("parameters", {}) or {}, dict, "a mapping"),
        outputs=_expect(path, "outputs", raw.get("outputs", []), list, "a list of tensor names"),
        steps=[_parse_step(path, i, s) for i, s in enumerate(steps_raw)],
        openai=_expect(path, "openai", raw.get("openai", {}) or {}, dict, "a mapping"),
        warmup=_check_warmup(path, "warmup", raw.get("warmup")),
        hub=_check_hub(path, raw.get("hub")))
    if "front_instances" in raw:
        cfg.front_instances = _check_count(path, "front_instances", raw["front_instances"])
    if "front_shape" in raw:
        if raw["front_shape"] not in ("batched", "unbatched"):
            raise ConfigError(path, "front_shape", "expected batched or unbatched")
        cfg.front_shape = raw["front_shape"]
    for k in cfg.parameters:
        if not any(k in field_types(s.cls.Params) for s in cfg.steps):
            raise ConfigError(path, f"parameters.{k}", "no step has such a parameter")
    keys = [s.key for s in cfg.steps]
    if len(set(keys)) != len(keys):
        raise ConfigError(path, "steps", f"step keys must be unique, got {keys}")
    for s in cfg.steps:
        mbs = cfg.max_batch_size if s.max_batch_size is None else s.max_batch_size
        if mbs < cfg.max_batch_size:
            raise ConfigError(path, f"steps.{s.key}.max_batch_size",
                              f"{mbs} is below the ensemble's max_batch_size {cfg.max_batch_size}")
    return cfg


def _non_negative(file, key: str, value: Any) -> int:
    _expect(file, key, value, int, "an integer")
    if value < 0:
        raise ConfigError(file, key, f"expected an integer >= 0, got {value}")
    return value


QUEUE_KEYS = ("max_queue_delay_us", "max_queue_size", "default_timeout_us")


def apply_override(cfg: EnsembleConfig, dotted: str, value: str) -> None:
    """`--set ar.max_num_seqs=128` (step key, parameter), `--set codec.max_queue_delay_us=20000` or
    `--set max_batch_size=16`."""
    parts = dotted.split(".")
    if len(parts) == 1 and parts[0] == "max_batch_size":
        cfg.max_batch_size = int(value)
        return
    if len(parts) == 1 and parts[0] == "front_instances":
        cfg.front_instances = int(value)
        return
    if parts[-1] == "warmup" and len(parts) <= 2:       # `--set warmup=false`, `--set denoise.warmup={sizes: [...]}`
        step = next((s for s in cfg.steps if s.key == parts[0]), None) if len(parts) == 2 else cfg
        if step is None:
            raise ConfigError(cfg.source, dotted, f"no step {parts[0]!r}")
        step.warmup = _check_warmup(cfg.source, dotted, yaml.safe_load(value))
        return
    if len(parts) == 1 and any(parts[0] in field_types(s.cls.Params) for s in cfg.steps):
        cfg.parameters[parts[0]] = yaml.safe_load(value)
        return
    if len(parts) == 2:
        step = next((s for s in cfg.steps if s.key == parts[0]), None)
        if step is None:
            raise ConfigError(cfg.source, dotted, f"no step {parts[0]!r}")
        if parts[1] in ("count", "kind"):
            setattr(step, parts[1], int(value) if parts[1] == "count" else value)
            return
        if parts[1] in QUEUE_KEYS and step.batching is not None:
            setattr(step.batching, parts[1], _non_negative(cfg.source, dotted, int(value)))
            return
        step.parameters[parts[1]] = yaml.safe_load(value)
        _check_parameters(cfg.source, f"steps.{step.key}", step)
        return
    raise ConfigError(cfg.source, dotted, "override keys are <step>.<parameter>, <step>.count, <step>.kind, "
                                          "<step>.max_queue_delay_us (or max_queue_size, default_timeout_us), "
                                          "<step>.warmup, a shared <parameter>, "
                                          "max_batch_size, front_instances or warmup")
