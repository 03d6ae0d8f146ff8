"""Pick and load the engine's model class for a Hugging Face checkpoint folder."""
from __future__ import annotations

import contextlib
import importlib
import json
from pathlib import Path

import torch
from torch import nn

from triton_omni.models import quant
from triton_omni.models.loader import checkpoint_names, load_weights
from triton_omni.models.moe import SparseMoeBlock


# model_type -> (module, class); imported only when a checkpoint of that type is loaded
MODELS = {
    "qwen3": ("triton_omni.models.qwen3", "Qwen3ForCausalLM"),
    "qwen3_5": ("triton_omni.models.qwen3_5", "Qwen3_5ForCausalLM"),
    "qwen3_5_text": ("triton_omni.models.qwen3_5", "Qwen3_5ForCausalLM"),
    "qwen3_moe": ("triton_omni.models.qwen3_moe", "Qwen3MoeForCausalLM"),
    "qwen3_5_moe": ("triton_omni.models.qwen3_5_moe", "Qwen3_5MoeForCausalLM"),
    "qwen3_5_moe_text": ("triton_omni.models.qwen3_5_moe", "Qwen3_5MoeForCausalLM"),
    "llama": ("triton_omni.models.llama", "LlamaForCausalLM"),
    # speech recognition: the decoder of an audio-encoder + LLM checkpoint (its encoder runs in asr/)
    "qwen3_asr": ("triton_omni.models.qwen3", "Qwen3ASRDecoder"),
    "omniasr": ("triton_omni.models.llama", "OmniASRDecoder"),
    "higgs_audio": ("triton_omni.models.llama", "HiggsAudioDecoder"),
    # Qwen3-Omni: the thinker's text decoder (its audio tower runs in omni/; talker and code2wav are not served)
    "qwen3_omni_moe": ("triton_omni.models.qwen3_omni", "Qwen3OmniThinkerForCausalLM"),
}


# checkpoints whose config class transformers does not have (their own packages': boson-multimodal's
# "higgs_audio"): the decoder's config is built from their text_config alone
OWN_CONFIGS = ("higgs_audio",)


def own_text_config(raw: dict):
    from transformers import AutoConfig

    text = dict(raw.get("text_config") or {})
    if "model_type" not in text:
        raise ValueError(f"config.json of model_type {raw.get('model_type')!r} has no text_config.model_type")
    known = {k: v for k, v in text.items() if not k.startswith("_") and k not in ("architectures", "transformers_version")}
    return AutoConfig.for_model(known.pop("model_type"), **known)


def text_config(folder: str | Path):
    """The decoder's config (the text part of a multimodal checkpoint's config)."""
    from transformers import AutoConfig

    raw = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    if raw.get("model_type") in OWN_CONFIGS:
        return own_text_config(raw), raw["model_type"]
    top = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    # Qwen3-Omni nests the decoder one level further: thinker_config.text_config
    config = getattr(top, "thinker_config", None) or top
    text = getattr(config, "text_config", None)
    if text is None:
        return config, top.model_type
    # a multimodal checkpoint ties its lm_head by the top-level flag, as transformers does
    text.tie_word_embeddings = getattr(config, "tie_word_embeddings", getattr(text, "tie_word_embeddings", False))
    return text, top.model_type


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype | None):
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype or saved)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def build_causal_lm(folder: str | Path, device: str | torch.device, dtype: torch.dtype | None = None) -> nn.Module:
    """The model class for the folder's config.json, built on `device` with uninitialised weights (on
    the meta device: no memory, which is how the converter checks a checkpoint's tensors), its
    parameters in `dtype` from the start (a 30B MoE built in fp32 first would need 120 GB of memory
    to hold 60 GB of bf16 weights; rotary tables are fp32 either way)."""
    config, model_type = text_config(folder)
    if model_type not in MODELS:
        raise ValueError(f"{folder}: model_type {model_type!r} is not supported; supported: {sorted(MODELS)}")
    module, name = MODELS[model_type]
    with torch.device(device), _default_dtype(dtype):
        return getattr(importlib.import_module(module), name)(config)


def load_causal_lm(folder: str | Path, device: str | torch.device, dtype: torch.dtype,
                   dummy: bool = False, quantization: str = quant.NONE, lm_head: bool = False) -> nn.Module:
    """The model for a checkpoint folder. `dummy`: random weights from config.json alone (for
    benchmarks of real-size shapes without their weights). `quantization` (models/quant.py SCHEMES):
    the linear layers in FP8, and the lm_head too with `lm_head`; an FP8 checkpoint's own blocks are
    kept where the model can hold them."""
    model = build_causal_lm(folder, device, dtype)
    fp8 = quantization != quant.NONE
    if fp8:
        quant.check_scheme(quantization, device)
        if any(isinstance(m, SparseMoeBlock) for m in model.modules()):
            raise ValueError(f"parameter 'quantization': {quantization} is not supported for mixture-of-experts "
                             f"models ({type(model).__name__}); their experts are served in 16 bits")
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
