"""Tiny random mixture-of-experts chat checkpoints (Qwen3-MoE, Qwen3.5-MoE) with the project's ChatML
tokenizer (see converters/tiny.py): 8 experts, 2 a token; Qwen3.5-MoE's with its shared expert."""
from __future__ import annotations

from pathlib import Path

from triton_omni.converters.tiny_common import chat_builder, quiet_markers, randomize

EXPERTS = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)


def qwen3_moe(out: Path, tokenizer) -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                            norm_topk_prob=True, tie_word_embeddings=True,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **EXPERTS)
    model = randomize(Qwen3MoeForCausalLM(config), seed=30, std=0.25)
    quiet_markers(model, tokenizer)
    model.save_pretrained(str(out))


def qwen3_5_moe(out: Path, tokenizer) -> None:
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    config = Qwen3_5MoeTextConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=4,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                                  linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=4096,
                                  shared_expert_intermediate_size=32, tie_word_embeddings=True,
                                  rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                                   "partial_rotary_factor": 0.25},
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **EXPERTS)
    model = randomize(Qwen3_5MoeForCausalLM(config), seed=36, std=0.25)
    quiet_markers(model, tokenizer)
    model.save_pretrained(str(out))


BUILDERS: dict = {"qwen3_moe": chat_builder(qwen3_moe), "qwen3_5_moe": chat_builder(qwen3_5_moe)}
