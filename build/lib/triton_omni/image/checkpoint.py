"""A diffusers pipeline folder (model_index.json + one subfolder per component) and its parts.

Each step loads only the components it runs, with the classes model_index.json names, exactly as
`DiffusionPipeline.from_pretrained` would: the text encoder step never holds the transformer.
Nothing here downloads; the folder must be complete.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from triton_omni.runtime.params import torch_dtype
from triton_omni.runtime.step import StepContext



def pipeline_folder(ctx: StepContext, value: str) -> Path:
    """The checkpoint parameter as a folder that holds a diffusers pipeline; a clear error if not."""
    folder = ctx.path(value) if value else None
    if folder is None or not (folder / "model_index.json").exists():
        raise FileNotFoundError(f"{ctx.model_name}: checkpoint folder {str(folder)!r} (parameter 'checkpoint') has "
                                "no model_index.json; build it (`python -m triton_omni.converters tiny`) or pass "
                                "--checkpoint NAME=DIR with a downloaded diffusers pipeline folder")
    return folder


def model_index(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "model_index.json").read_text())


def component_config(folder: Path, name: str) -> dict[str, Any]:
    """A component's config.json (scheduler: scheduler_config.json), read without loading weights."""
    sub = folder / name
    path = sub / "config.json" if (sub / "config.json").exists() else sub / "scheduler_config.json"
    return json.loads(path.read_text())


def vae_scale_factor(folder: Path) -> int:
    """Pixels per latent cell, as the pipelines compute it: 2 ** (VAE blocks - 1), or for the causal
    video VAE of Qwen-Image (AutoencoderKLQwenImage) 2 ** (its temporal-downsample stages)."""
    config = component_config(folder, "vae")
    if "temperal_downsample" in config:                   # sic: diffusers' spelling of the key
        return 2 ** len(config["temperal_downsample"])
    return 2 ** (len(config["block_out_channels"]) - 1)


def load_component(folder: Path, name: str, dtype: str = "float32", device: str = "cpu"):
    """Load one component with the class model_index.json gives it, in eval mode on `device`."""
    library, class_name = model_index(folder)[name]
    cls = getattr(importlib.import_module(library), class_name)
    path = str(folder / name)
    if library == "transformers":
        model = cls.from_pretrained(path, dtype=torch_dtype(dtype), local_files_only=True)
    elif getattr(cls, "_keep_in_fp32_modules", None):
        # diffusers keeps these modules in float32 only when it loads through accelerate.
        if importlib.util.find_spec("accelerate") is None:
            model = _load_keeping_fp32_modules(cls, folder / name, dtype)
        else:
            model = cls.from_pretrained(path, torch_dtype=torch_dtype(dtype), local_files_only=True)
    else:
        model = cls.from_pretrained(path, torch_dtype=torch_dtype(dtype), low_cpu_mem_usage=False,
                                    local_files_only=True)
    return model.to(device).eval()


def _load_keeping_fp32_modules(cls, path: Path, dtype: str):
    """A diffusers model that names modules to keep in float32 (`_keep_in_fp32_modules`, e.g. the
    JoyImage transformer): diffusers loads those only through accelerate, which this environment does
    not have, so build it from its config, load the safetensors shards, and cast as diffusers would
    (everything to `dtype` except parameters whose names hold one of those module names)."""
    import torch
    from safetensors.torch import load_file

    model = cls.from_config(cls.load_config(str(path)))
    index = path / "diffusion_pytorch_model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() \
        else ["diffusion_pytorch_model.safetensors"]
    state = {}
    for f in files:
        state.update(load_file(str(path / f)))
    model.load_state_dict(state, strict=True)
    keep = tuple(cls._keep_in_fp32_modules)
    for name, p in model.named_parameters():
        p.data = p.data.to(torch.float32 if any(k in name for k in keep) else torch_dtype(dtype))
    return model


def load_scheduler(folder: Path):
    """The scheduler, from its config (it has no weights)."""
    library, class_name = model_index(folder)["scheduler"]
    cls = getattr(importlib.import_module(library), class_name)
    return cls.from_pretrained(str(folder / "scheduler"), local_files_only=True)


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder / "tokenizer"), local_files_only=True)
