"""Tiny random chat checkpoints (Qwen3, Qwen3.5) with the project's ChatML tokenizer (see converters/tiny.py)."""
from __future__ import annotations

import json
from pathlib import Path

from triton_omni.converters.tiny_common import CHAT_MARKERS, build_tokenizer, randomize


def qwen3(out: Path, tokenizer) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = Qwen3ForCausalLM(config)
    randomize(model, seed=3, std=0.25)
    quiet_markers(model, tokenizer)
    model.save_pretrained(str(out))


def qwen3_5(out: Path, tokenizer) -> None:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                               linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=4096,
                               tie_word_embeddings=True,
                               rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                                "partial_rotary_factor": 0.25},
                               eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = Qwen3_5ForCausalLM(config)
    randomize(model, seed=35, std=0.25)
    quiet_markers(model, tokenizer)
    model.save_pretrained(str(out))


def quiet_markers(model, tokenizer) -> None:
    """Near-zero embeddings (and so, tied, logits) for the reasoning / tool-call markers: random
    weights then never open or close reasoning or a tool call by themselves (plain chat stays plain
    content); a request's reasoning budget or a tool-call grammar still produces them."""
    import torch

    ids = [tokenizer.convert_tokens_to_ids(m) for m in CHAT_MARKERS]
    with torch.no_grad():
        model.get_input_embeddings().weight[ids] *= 0.01


def _chat_builder(make):
    """A chat checkpoint: the tiny tokenizer (with Qwen's markers), the model, an EOS-aware generation config."""
    def build(out: Path) -> None:
        tokenizer = build_tokenizer(out, chat_markers=True)
        make(out, tokenizer)
        gen = {"eos_token_id": [tokenizer.eos_token_id, tokenizer.pad_token_id]}
        (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return build


BUILDERS: dict = {"qwen3": _chat_builder(qwen3), "qwen3_5": _chat_builder(qwen3_5)}
