"""Typed step parameters: a dataclass per step, filled from config.pbtxt's string parameters.

The converter checks YAML parameters against the same dataclass, so a misspelt key fails at build
time with the file and key named, not deep inside a model at load time.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any


def field_types(params_cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(params_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(params_cls)}


def parse_value(name: str, text: str, typ: Any) -> Any:
    """Parse one parameter's string form into its declared type."""
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if origin is typing.Union and type(None) in args:          # Optional[X]
        if text in ("", "none", "None", "null"):
            return None
        return parse_value(name, text, next(a for a in args if a is not type(None)))
    if typ is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"parameter {name!r}: expected a boolean, got {text!r}")
    if typ in (int, float, str):
        try:
            return typ(text)
        except ValueError:
            raise ValueError(f"parameter {name!r}: expected {typ.__name__}, got {text!r}") from None
    if origin in (list, tuple):
        try:
            items = json.loads(text) if text.strip().startswith("[") else [t for t in text.split(",") if t.strip()]
            return origin(parse_value(name, str(v), args[0]) for v in items)
        except json.JSONDecodeError:
            raise ValueError(f"parameter {name!r}: expected a list, got {text!r}") from None
    raise TypeError(f"parameter {name!r}: unsupported type {typ}")


def format_value(value: Any) -> str:
    """The string form written into config.pbtxt (the inverse of parse_value)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(format_value(v) for v in value)
    return "" if value is None else str(value)


def parse_params(params_cls: type, raw: dict[str, str], strict: bool = True):
    """Build `params_cls` from {key: string}; unknown keys are an error when strict."""
    types = field_types(params_cls)
    unknown = sorted(set(raw) - set(types))
    if unknown and strict:
        raise ValueError(f"unknown parameter(s) {unknown}; known: {sorted(types)}")
    return params_cls(**{k: parse_value(k, v, types[k]) for k, v in raw.items() if k in types})


TORCH_DTYPES = ("float32", "bfloat16", "float16")


def torch_dtype(name: str):
    """A step's `dtype` parameter as a torch dtype (torch imported only by the steps that need it)."""
    import torch

    if name not in TORCH_DTYPES:
        raise ValueError(f"parameter 'dtype': expected one of {', '.join(TORCH_DTYPES)}, got {name!r}")
    return getattr(torch, name)
