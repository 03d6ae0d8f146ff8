"""Pick and load the engine's model class for a Hugging Face checkpoint folder."""
from __future__ import annotations

import importlib
from pathlib import Path

import torch
from torch import nn

from triton_omni.models import quant
from triton_omni.models.loader import checkpoint_names, load_weights


# model_type -> (module, class); imported only when a checkpoint of that type is loaded
MODELS = {
    "qwen3": ("triton_omni.models.qwen3", "Qwen3ForCausalLM"),
    "qwen3_5": ("triton_omni.models.qwen3_5", "Qwen3_5ForCausalLM"),
    "qwen3_5_text": ("triton_omni.models.qwen3_5", "Qwen3_5ForCausalLM"),
    "llama": ("triton_omni.models.llama", "LlamaForCausalLM"),
}


def text_config(folder: str | Path):
    """The decoder's config (the text part of a multimodal checkpoint's config)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    text = getattr(config, "text_config", None)
    if text is None:
        return config, config.model_type
    # a multimodal checkpoint ties its lm_head by the top-level flag, as transformers does
    text.tie_word_embeddings = getattr(config, "tie_word_embeddings", text.tie_word_embeddings)
    return text, config.model_type


def build_causal_lm(folder: str | Path, device: str | torch.device) -> nn.Module:
    """The model class for the folder's config.json, built on `device` with uninitialised weights (on
    the meta device: no memory, which is how the converter checks a checkpoint's tensors)."""
    config, model_type = text_config(folder)
    if model_type not in MODELS:
        raise ValueError(f"{folder}: model_type {model_type!r} is not supported; supported: {sorted(MODELS)}")
    module, name = MODELS[model_type]
    with torch.device(device):
        return getattr(importlib.import_module(module), name)(config)


def load_causal_lm(folder: str | Path, device: str | torch.device, dtype: torch.dtype,
                   dummy: bool = False, quantization: str = quant.NONE, lm_head: bool = False) -> nn.Module:
    """The model for a checkpoint folder. `dummy`: random weights from config.json alone (for
    benchmarks of real-size shapes without their weights). `quantization` (models/quant.py SCHEMES):
    the linear layers in FP8, and the lm_head too with `lm_head`; an FP8 checkpoint's own blocks are
    kept where the model can hold them."""
    model = build_causal_lm(folder, device)
    fp8 = quantization != quant.NONE
    if fp8:
        quant.check_scheme(quantization, device)
    elif lm_head:
        raise ValueError(f"parameter 'quantize_lm_head': needs quantization {' or '.join(quant.SCHEMES)}")
    if dummy:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.normal_(0.0, 0.02) if not n.endswith("norm.weight") else p.fill_(1.0)
    else:
        block = quant.checkpoint_block(folder)
        if fp8 and block is not None:
            quant.prepare_checkpoint_fp8(model, block, quantization, quant.fp8_parts(model, checkpoint_names(folder)))
        load_weights(model, folder)
    kept = quant.fp8_parameters(model)
    for p in model.parameters():          # parameters to the model dtype; rotary tables stay fp32, FP8 as loaded
        if id(p) not in kept:
            p.data = p.data.to(dtype)
    if fp8:
        quant.quantize_decoder(model, quantization, lm_head)
    return model.eval()
