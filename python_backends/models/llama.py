"""Llama (1/2/3) decoder for the AR engine; parameter names match `LlamaForCausalLM` checkpoints.

Qwen3's structure without the q/k RMSNorm. Rope comes from `rope_inv_freq`, which covers Llama 3's
frequency-dependent scaling ("llama3") as well as plain rope. `attention_bias` puts biases on q/k/v/o,
`mlp_bias` on gate/up/down, as in transformers. Talkers such as Orpheus are Llama checkpoints.
"""
from __future__ import annotations

import torch
from torch import nn

from kernels import dispatch
from python_backends.models.attention import PagedAttention
from python_backends.models.context import ForwardContext
from python_backends.models.layers import MergedLinear, RMSNorm, RotaryEmbedding, rope_inv_freq


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class LlamaAttention(nn.Module):
    def __init__(self, config, rotary: RotaryEmbedding):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = _head_dim(config)
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias = getattr(config, "attention_bias", False)
        self.qkv_proj = MergedLinear(config.hidden_size, [q, kv, kv], bias=bias)
        self.o_proj = nn.Linear(q, config.hidden_size, bias=bias)
        self.rotary = rotary
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim ** -0.5)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.out_sizes, dim=-1)
        q, k = self.rotary(positions, q.view(-1, self.num_heads, self.head_dim),
                           k.view(-1, self.num_kv_heads, self.head_dim))
        o = self.attn(q, k, v.view(-1, self.num_kv_heads, self.head_dim), ctx)
        return self.o_proj(o.reshape(-1, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up fused; biases when the checkpoint has `mlp_bias`."""

    def __init__(self, config):
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        self.gate_up_proj = MergedLinear(config.hidden_size, [config.intermediate_size] * 2, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(dispatch.silu_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, rotary: RotaryEmbedding):
        super().__init__()
        self.self_attn = LlamaAttention(config, rotary)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, residual, positions, ctx):
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, positions, ctx)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        inv_freq, scaling = rope_inv_freq(config, _head_dim(config))
        rotary = RotaryEmbedding(inv_freq, config.max_position_embeddings, scaling)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, rotary) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = rotary

    def forward(self, input_ids, positions, ctx):
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(x, residual, positions, ctx)
        x, _ = self.norm(x, residual)
        return x


class LlamaForCausalLM(nn.Module):
    # checkpoint name fragment -> (our merged module's name fragment, part index)
    packed = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
              "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
