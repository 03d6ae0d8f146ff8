"""Load Hugging Face-format checkpoints (config.json + *.safetensors) into our model classes.

Parameter names stay the checkpoint's own; a model class lists the projections it fuses
(`packed`: "q_proj" -> ("qkv_proj", 0)) and may rename prefixes (`rename`: e.g. the language model
inside a multimodal checkpoint). A mixture-of-experts layer keeps its experts stacked (`experts.gate_up_proj`
[E, 2I, H], `experts.down_proj` [E, H, I], as transformers 5 does): checkpoints with those tensors load
them by name, checkpoints with one tensor per expert (`experts.3.gate_proj.weight`, Qwen3-MoE's) into
their slices. Every parameter must be filled, or loading fails naming the missing.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable, Iterator

import torch
from safetensors import safe_open
from torch import nn

# one expert's projection in a per-expert checkpoint -> the stacked parameter it is a slice of
EXPERT_TENSOR = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
STACKED = {"gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj"}


def checkpoint_tensors(folder: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors files")
    for name in files:
        with safe_open(str(folder / name), framework="pt") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)


def checkpoint_names(folder: str | Path) -> list[str]:
    """The names of a folder's tensors, from the files' headers (no tensor is read)."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return list(json.loads(index.read_text())["weight_map"])
    names = []
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            names += list(f.keys())
    return names


def placement(model: nn.Module):
    """checkpoint name -> (the model's parameter name, part index in a merged module or None), or
    (None, None) for a name the model skips; by the model's `rename`, `skip_prefixes`, `skip_parts` (name
    fragments, e.g. another path's modules inside each layer) and `packed`, and one expert's tensor into
    the stacked experts where the model has them (part: (expert, projection))."""
    packed: dict[str, tuple[str, int]] = getattr(model, "packed", {})
    rename: dict[str, str] = getattr(model, "rename", {})
    skip: tuple[str, ...] = getattr(model, "skip_prefixes", ())
    skip_parts: tuple[str, ...] = getattr(model, "skip_parts", ())
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}

    def place(name: str) -> tuple[str | None, int | tuple | None]:
        for old, new in rename.items():
            if name.startswith(old):
                name = new + name[len(old):]
                break
        if name.startswith(skip) or any(part in name for part in skip_parts):
            return None, None
        expert = EXPERT_TENSOR.search(name)
        if expert and f"{name[:expert.start()]}.experts.{STACKED[expert[2]]}" in names:
            return f"{name[:expert.start()]}.experts.{STACKED[expert[2]]}", (int(expert[1]), expert[2])
        for frag, (merged, index) in packed.items():
            if f".{frag}." in name:
                return name.replace(f".{frag}.", f".{merged}."), index
        return name, None
    return place


def load_weights(model: nn.Module, folder: str | Path,
                 tensors: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
    """Fill the model from the folder's tensors (`tensors`: others in their place, e.g. meta tensors of
    the headers' shapes, which checks names and shapes without reading weights). An FP8 checkpoint's
    weights fill the model's FP8 layers as they are and are dequantized for the others (models/quant.py)."""
    from triton_omni.models import quant

    params = dict(model.named_parameters(remove_duplicate=False))
    place = placement(model)
    filled: set[str] = set()
    stream = checkpoint_tensors(folder) if tensors is None else tensors
    if quant.checkpoint_block(folder) is not None:
        if tensors is not None:
            stream = list(stream)
        names = checkpoint_names(folder) if tensors is None else [n for n, _ in stream]
        stream = quant.dequantized_stream(stream, quant.scaled_prefixes(names),
                                          lambda n: place(n)[0] in params, str(folder))
    for name, tensor in stream:
        target, part = place(name)
        if target is None:
            continue
        if target not in params:
            raise KeyError(f"{folder}: checkpoint tensor {name!r} has no place in {type(model).__name__}")
        param = params[target]
        with torch.no_grad():
            if part is None:
                if param.shape != tensor.shape:
                    raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(param.shape)}")
                param.copy_(tensor)
            else:
                module = model.get_submodule(target.rsplit(".", 1)[0])
                module.load_part(part, tensor, target.rsplit(".", 1)[1])
        filled.add(f"{target}#{part}" if part is not None else target)
    tied = {n for n, p in params.items() if any(p is q for m, q in params.items() if m != n)}
    missing = []
    for n, p in params.items():
        mod = n.rsplit(".", 1)
        owner = model.get_submodule(mod[0]) if len(mod) == 2 else model
        parts = []                       # a merged parameter is filled whole or by all of its parts
        if hasattr(owner, "load_part"):
            parts = owner.parts(mod[1]) if hasattr(owner, "parts") else range(len(owner.out_sizes))
        names = [f"{n}#{i}" for i in parts]
        if not (n in filled or (names and all(x in filled for x in names))) \
                and not (n in tied and any(t in filled for t in tied)):
            missing.append(n)
    if missing:
        raise KeyError(f"{folder}: checkpoint lacks {len(missing)} parameter(s), e.g. {missing[:5]}")
