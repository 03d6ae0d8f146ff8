"""The frame the decoder LMs here share: token embedding -> decoder layers -> final norm -> lm_head,
with the residual stream carried between layers (fused add + RMSNorm), and the dense Llama-style
layer itself (Qwen3 adds a per-head RMSNorm on q and k). Parameter names are the checkpoints'."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from triton_omni.kernels import dispatch
from triton_omni.models.attention import PagedAttention
from triton_omni.models.context import ForwardContext
from triton_omni.models.layers import GatedMLP, Linear, MergedLinear, RMSNorm, RotaryEmbedding, rotary_embedding

# checkpoint name fragment -> (our merged module's name fragment, part index)
PACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class Attention(nn.Module):
    """Grouped-query attention over the paged cache; `qk_norm`: RMSNorm per head on q and k (Qwen3)."""

    def __init__(self, config, rotary: RotaryEmbedding, qk_norm: bool):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, head_dim(config)
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias = getattr(config, "attention_bias", False)
        self.qkv_proj = MergedLinear(config.hidden_size, [q, kv, kv], bias=bias)
        self.o_proj = Linear(q, config.hidden_size, bias=bias)
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qk_norm = qk_norm
        self.rotary = rotary
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim ** -0.5)

    @property
    def first_proj(self) -> MergedLinear:
        return self.qkv_proj

    def forward(self, qkv: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """qkv: the output of `first_proj` (the layer computes it, with its norm folded in)."""
        q, k, v = qkv.split(self.qkv_proj.out_sizes, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        o = self.attn(q, k, v.view(-1, self.num_kv_heads, self.head_dim), positions, ctx, self.rotary,
                      *((self.q_norm, self.k_norm) if self.qk_norm else ()))
        return self.o_proj(o.reshape(-1, self.num_heads * self.head_dim))


class DecoderLayer(nn.Module):
    """norm -> mixer (attention, or linear attention) -> norm -> MLP, residuals fused into the norms.
    Each norm runs with the projection after it (`dispatch.norm_linear`: one kernel for a batch-1
    decode row on the GPU), so a mixer takes the output of its `first_proj`, not the hidden state. An
    MLP that `norms_input` (models/moe.py) is handed the residual stream and its norm instead."""

    def __init__(self, config, mixer: nn.Module, mlp: nn.Module, mixer_name: str = "self_attn",
                 zero_centered: bool = False):
        super().__init__()
        self.mixer_name = mixer_name
        setattr(self, mixer_name, mixer)                # under the checkpoint's name for it
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, zero_centered=zero_centered)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, zero_centered=zero_centered)

    def forward(self, x, residual, positions, ctx):
        mixer = getattr(self, self.mixer_name)
        projected, residual = _norm_linear(self.input_layernorm, mixer.first_proj, x, residual)
        x = mixer(projected, positions, ctx)
        if getattr(self.mlp, "norms_input", False):      # a MoE block: it needs the normalised input itself
            return self.mlp(x, residual, self.post_attention_layernorm)
        gate_up, residual = _norm_linear(self.post_attention_layernorm, self.mlp.gate_up_proj, x, residual)
        return self.mlp.down_proj(gate_up, gated=True), residual


def _norm_linear(norm: RMSNorm, linear: MergedLinear, x, residual):
    scale = getattr(linear, "weight_scale_inv", None)           # FP8 weights (models/quant.py)
    if scale is not None:
        return dispatch.fp8_norm_linear(x, residual, norm.weight, norm.eps, norm.zero_centered, linear.weight, scale,
                                        linear.bias)
    return dispatch.norm_linear(x, residual, norm.weight, norm.eps, norm.zero_centered, linear.weight, linear.bias)


class DecoderModel(nn.Module):
    def __init__(self, config, make_layer: Callable[[int, RotaryEmbedding], nn.Module], zero_centered: bool = False):
        super().__init__()
        # rotates only the first dims of a head with a partial rotary; a multimodal rope (mrope) is the
        # 1-D rope for text tokens and differs only where the engine sets ctx.rope_positions
        self.rotary = rotary_embedding(config, head_dim(config))
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(make_layer(i, self.rotary) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, zero_centered=zero_centered)

    def forward(self, input_ids, positions, ctx):
        """input_ids [T] (token ids), or the input embeddings [T, H] themselves (a prompt with spliced
        embeddings: the engine embeds the ids and splices in the rest)."""
        x = input_ids if input_ids.is_floating_point() else self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, positions, ctx)
        x, _ = self.norm(x, residual)
        return x


class CausalLM(nn.Module):
    """A decoder model + lm_head (tied to the embedding when the config says so)."""

    packed = PACKED

    def __init__(self, config, model: DecoderModel):
        super().__init__()
        self.config = config
        self.model = model
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        return self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token ids [T] -> input embeddings [T, H] (what forward takes in their place)."""
        return self.model.embed_tokens(input_ids)

    @property
    def rope_axes(self) -> int:
        """Rotary position axes per token: 3 for a multimodal rope, else 1 (the engine's rope_positions rows)."""
        return self.model.rotary.axes


def dense_layer(config, rotary: RotaryEmbedding, qk_norm: bool) -> DecoderLayer:
    mlp = GatedMLP(config.hidden_size, config.intermediate_size, bias=getattr(config, "mlp_bias", False))
    return DecoderLayer(config, Attention(config, rotary, qk_norm), mlp)
