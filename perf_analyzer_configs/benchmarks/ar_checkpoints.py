"""The Qwen3 / Qwen3.5 shapes the AR benchmarks and probes run (the released config.json files), dense
and mixture-of-experts, as checkpoints of configs and a tokenizer of the real vocabulary size, no
weights (the engine's dummy load), and the prompts they send."""
from __future__ import annotations

import json
import random
from pathlib import Path

QWEN3_COMMON = dict(model_type="qwen3", vocab_size=151936, head_dim=128, max_position_embeddings=40960,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
                    bos_token_id=151643, eos_token_id=151645)
QWEN3_5_COMMON = dict(model_type="qwen3_5_text", vocab_size=248320, head_dim=256, max_position_embeddings=262144,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                       "mrope_section": [11, 11, 10], "mrope_interleaved": True},
                      rms_norm_eps=1e-6, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                      bos_token_id=248043, eos_token_id=248044)
QWEN3_MOE = dict(QWEN3_COMMON, model_type="qwen3_moe", num_experts=128, num_experts_per_tok=8,
                 moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
SHAPES = {   # the released config.json files (Qwen3.5: the text_config of the multimodal checkpoints)
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, tie_word_embeddings=True, **QWEN3_COMMON),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, tie_word_embeddings=False, **QWEN3_COMMON),
    "qwen3.5-0.8b": dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
                         num_key_value_heads=2, linear_num_key_heads=16, linear_num_value_heads=16,
                         tie_word_embeddings=True, **QWEN3_5_COMMON),
    "qwen3.5-9b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=32, num_attention_heads=16,
                       num_key_value_heads=4, linear_num_key_heads=16, linear_num_value_heads=32,
                       tie_word_embeddings=False, **QWEN3_5_COMMON),
    # Qwen3-30B-A3B; Qwen3-Omni-30B-A3B's thinker is this shape (its vocabulary: 152,064)
    "qwen3-30b-a3b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32,
                          num_key_value_heads=4, tie_word_embeddings=False, **QWEN3_MOE),
    # Qwen3.5-35B-A3B (its text_config): 3 Gated DeltaNet layers to 1 attention layer, 8 of 256 experts
    # and a shared expert in every layer
    "qwen3.5-35b-a3b": dict(hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
                            linear_num_key_heads=16, linear_num_value_heads=32, tie_word_embeddings=False,
                            num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                            shared_expert_intermediate_size=512,
                            **{**QWEN3_5_COMMON, "model_type": "qwen3_5_moe_text"}),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, **{**QWEN3_COMMON, "vocab_size": 2048, "head_dim": 16,
                                           "bos_token_id": 2040, "eos_token_id": 2042}, tie_word_embeddings=True),
    "tiny3.5": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, linear_num_key_heads=2, linear_num_value_heads=4, tie_word_embeddings=True,
                    **{**QWEN3_5_COMMON, "vocab_size": 2048, "head_dim": 32, "linear_key_head_dim": 16,
                       "linear_value_head_dim": 16, "bos_token_id": 2040, "eos_token_id": 2042}),
    "tiny-moe": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, tie_word_embeddings=True,
                     **{**QWEN3_MOE, "vocab_size": 2048, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2,
                        "moe_intermediate_size": 32, "bos_token_id": 2040, "eos_token_id": 2042}),
    "tiny3.5-moe": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                        linear_num_key_heads=2, linear_num_value_heads=4, tie_word_embeddings=True, num_experts=8,
                        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                        **{**QWEN3_5_COMMON, "model_type": "qwen3_5_moe_text", "vocab_size": 2048, "head_dim": 32,
                           "linear_key_head_dim": 16, "linear_value_head_dim": 16, "bos_token_id": 2040,
                           "eos_token_id": 2042}),
}
# the config class of each model_type, and the chat ensemble (ensemble_configs/) that serves it
CONFIGS = {"qwen3": "Qwen3Config", "qwen3_5_text": "Qwen3_5TextConfig", "qwen3_moe": "Qwen3MoeConfig",
           "qwen3_5_moe_text": "Qwen3_5MoeTextConfig"}
ENSEMBLES = {"qwen3": "qwen3_chat", "qwen3_5_text": "qwen3_5_chat", "qwen3_moe": "qwen3_moe_chat",
             "qwen3_5_moe_text": "qwen3_5_moe_chat"}
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def write_checkpoint(name: str, root: Path) -> Path:
    """config.json (real shape) + a tokenizer of the real vocabulary size; no weights (dummy load)."""
    import transformers

    from triton_omni.converters.tiny_common import synthetic_tokenizer

    folder = root / name
    if (folder / "config.json").exists():
        return folder
    shape = dict(SHAPES[name])
    getattr(transformers, CONFIGS[shape.pop("model_type")])(**shape).save_pretrained(str(folder))
    shape = SHAPES[name]
    bos = shape["bos_token_id"]
    synthetic_tokenizer(folder, shape["vocab_size"], {s: bos + i for i, s in enumerate(SPECIALS)})
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [shape["eos_token_id"]]}))
    return folder


def ensemble(name: str) -> str:
    """The chat ensemble that serves shape `name`."""
    return ENSEMBLES[SHAPES[name]["model_type"]]


def prompts(c, prompt_len, vocab, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(256, vocab - 1000) for _ in range(prompt_len)] for _ in range(c)]


def random_text(rng, n):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
