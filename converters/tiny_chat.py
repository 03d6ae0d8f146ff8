"""Tiny random chat checkpoints (Qwen3, Qwen3.5) with the project's ChatML tokenizer (see converters/tiny.py)."""
from __future__ import annotations

from pathlib import Path

from triton_omni.converters.tiny_common import chat_builder, quiet_markers, randomize


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


BUILDERS: dict = {"qwen3": chat_builder(qwen3), "qwen3_5": chat_builder(qwen3_5)}
