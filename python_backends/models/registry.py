"""Pick and load the engine's model class for a Hugging Face checkpoint folder."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from python_backends.models.loader import load_weights


def _classes() -> dict[str, type[nn.Module]]:
    from python_backends.models.qwen3 import Qwen3ForCausalLM
    from python_backends.models.qwen3_5 import Qwen3_5ForCausalLM

    return {"qwen3": Qwen3ForCausalLM, "qwen3_5": Qwen3_5ForCausalLM, "qwen3_5_text": Qwen3_5ForCausalLM}


def text_config(folder: str | Path):
    """The decoder's config (the text part of a multimodal checkpoint's config)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    return getattr(config, "text_config", None) or config, config.model_type


def load_causal_lm(folder: str | Path, device: str | torch.device, dtype: torch.dtype) -> nn.Module:
    config, model_type = text_config(folder)
    classes = _classes()
    if model_type not in classes:
        raise ValueError(f"{folder}: model_type {model_type!r} is not supported; supported: {sorted(classes)}")
    with torch.device(device):
        model = classes[model_type](config)
    load_weights(model, folder)
    return model.to(dtype=dtype).eval()
