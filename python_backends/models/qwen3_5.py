"""Qwen3.5 text decoder for the AR engine; parameter names match `Qwen3_5ForCausalLM` checkpoints
(and the language model inside `Qwen3_5ForConditionalGeneration` ones).

A hybrid: `config.layer_types` makes each layer either
- "linear_attention": Gated DeltaNet. A short causal depthwise conv over [q|k|v], then the gated
  delta rule, whose per-sequence state S [value_heads, key_dim, value_dim] replaces a KV cache:
      S_t = a_t S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - a_t S_{t-1}^T k_t),   o_t = S_t^T q_t
  with decay a_t = exp(g_t). Prefill runs it chunk-parallel, decode one step for all sequences.
- "full_attention": softmax attention over the paged KV cache whose output is gated by
  sigmoid(gate) (q_proj yields query and gate), with q/k RMSNorm and partial rotary (the first
  `partial_rotary_factor` of each head). Its mrope (layers.MRotaryEmbedding) reduces to plain 1-D
  rope for text: all three position components are the token's position. A prompt with images or
  video carries its own (time, height, width) positions (ar/prompt_embeds.py).
All RMSNorms but the DeltaNet output norm are zero-centred (scale by 1 + weight).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.kernels import dispatch, gated_delta_reference as reference
from triton_omni.models.attention import PagedAttention
from triton_omni.models.context import ForwardContext, RecurrentStateSpec
from triton_omni.models.decoder import PACKED, CausalLM, DecoderLayer, DecoderModel
from triton_omni.models.layers import GatedMLP, Linear, MergedLinear, RMSNorm, RotaryEmbedding


class GatedRMSNorm(RMSNorm):
    """RMSNorm (plain `weight` scale) of each value head's output, then gated by silu(z)."""

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return (super().forward(x).float() * F.silu(gate.float())).to(x.dtype)


class Qwen3_5GatedDeltaNet(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_k_heads, self.num_v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.head_k_dim, self.head_v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.kernel_size = config.linear_conv_kernel_dim
        if config.hidden_act != "silu":
            raise ValueError(f"Qwen3.5 linear attention expects silu, got {config.hidden_act!r}")
        # the checkpoint's in_proj_qkv / in_proj_z / in_proj_b / in_proj_a, fused: one matmul
        self.in_proj = MergedLinear(config.hidden_size, [self.conv_dim, self.value_dim, self.num_v_heads,
                                                         self.num_v_heads])
        # depthwise, no bias; only its weight [conv_dim, 1, kernel] is used
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel_size, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, config.hidden_size, bias=False)
        # bound by the engine: [num_slots, conv_dim, kernel - 1] (model dtype), [num_slots, Hv, dk, dv] (fp32)
        self.conv_state: torch.Tensor | None = None
        self.ssm_state: torch.Tensor | None = None

    def cache_spec(self) -> RecurrentStateSpec:
        # the conv keeps the last kernel-1 inputs; the delta rule its state matrix per value head
        return RecurrentStateSpec(conv_shape=(self.conv_dim, self.kernel_size - 1),
                                  state_shape=(self.num_v_heads, self.head_k_dim, self.head_v_dim))

    def _prefill_conv(self, x: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """silu(causal depthwise conv) of the packed prompts x [T, conv_dim]; keeps each prompt's last window."""
        # a prompt's last K - 1 inputs (zeros before its start) are what its first decode step extends;
        # copied whole, so a reused slot keeps nothing of its previous request
        last = ctx.prompts_cu()[1:].long() - 1
        window = reference.causal_windows(x, last, positions, self.kernel_size - 1)     # [S, K - 1, C]
        self.conv_state.index_copy_(0, ctx.state_slots, window.transpose(1, 2).to(self.conv_state.dtype))
        return dispatch.causal_conv1d_prefill(x, self.conv1d.weight[:, 0], positions)

    @property
    def first_proj(self) -> MergedLinear:
        return self.in_proj

    def forward(self, projected: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """projected: the output of `first_proj` (see DecoderLayer)."""
        T = projected.shape[0]
        qkv, z, b, a = projected.split(self.in_proj.out_sizes, dim=-1)
        z = z.view(T, self.num_v_heads, self.head_v_dim)
        if not ctx.is_prefill:
            # one token per sequence: conv step, then delta rule + gated norm (two kernels on the GPU)
            mixed = dispatch.causal_conv1d_update(qkv, self.conv_state, self.conv1d.weight[:, 0], ctx.state_slots)
            q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
            o = dispatch.gated_delta_decode(
                q.view(T, self.num_k_heads, self.head_k_dim), k.view(T, self.num_k_heads, self.head_k_dim),
                v.view(T, self.num_v_heads, self.head_v_dim), a, b, self.A_log, self.dt_bias, self.ssm_state,
                ctx.state_slots, z, self.norm.weight, self.norm.eps)
            return self.out_proj(o.reshape(T, self.value_dim))
        q, k, v = self._prefill_conv(qkv, positions, ctx).split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        chunks = ctx.memo.get("delta_rule_chunks")
        if chunks is None:      # the same for every layer of this forward: built once
            chunks = ctx.memo["delta_rule_chunks"] = dispatch.gated_delta_chunks(ctx.prompts_cu(), ctx.seq_lens, T)
        o = dispatch.gated_delta_prefill(
            q.view(T, self.num_k_heads, self.head_k_dim), k.view(T, self.num_k_heads, self.head_k_dim),
            v.view(T, self.num_v_heads, self.head_v_dim), a, b, self.A_log, self.dt_bias, chunks,
            self.ssm_state, ctx.state_slots)
        o = self.norm(o.to(projected.dtype), z)
        return self.out_proj(o.reshape(T, self.value_dim))


class Qwen3_5Attention(nn.Module):
    def __init__(self, config, rotary: RotaryEmbedding):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        # q_proj yields, per head, the query then its output gate: [H, 2 * head_dim]
        self.qkv_proj = MergedLinear(config.hidden_size, [2 * q, kv, kv], bias=config.attention_bias)
        self.o_proj = Linear(q, config.hidden_size, bias=config.attention_bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, zero_centered=True)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, zero_centered=True)
        self.rotary = rotary
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim ** -0.5)

    @property
    def first_proj(self) -> MergedLinear:
        return self.qkv_proj

    def forward(self, qkv: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """qkv: the output of `first_proj` (see DecoderLayer)."""
        qg, k, v = qkv.split(self.qkv_proj.out_sizes, dim=-1)
        q, gate = qg.view(-1, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        o = self.attn(q, k.view(-1, self.num_kv_heads, self.head_dim), v.view(-1, self.num_kv_heads, self.head_dim),
                      positions, ctx, self.rotary, self.q_norm, self.k_norm)
        o = o.reshape(-1, self.num_heads * self.head_dim) * torch.sigmoid(gate.reshape(o.shape[0], -1))
        return self.o_proj(o)


def qwen3_5_layer(config, layer_type: str, rotary: RotaryEmbedding, mlp: nn.Module | None = None) -> DecoderLayer:
    """A Gated DeltaNet layer or a gated attention layer, as `config.layer_types` says; its MLP dense
    unless given (Qwen3.5-MoE's experts)."""
    if layer_type == "linear_attention":
        mixer, name = Qwen3_5GatedDeltaNet(config), "linear_attn"
    elif layer_type == "full_attention":
        mixer, name = Qwen3_5Attention(config, rotary), "self_attn"
    else:
        raise ValueError(f"unknown Qwen3.5 layer type {layer_type!r}")
    mlp = mlp if mlp is not None else GatedMLP(config.hidden_size, config.intermediate_size)
    return DecoderLayer(config, mixer, mlp, mixer_name=name, zero_centered=True)


class Qwen3_5ForCausalLM(CausalLM):
    packed = {**PACKED, "in_proj_qkv": ("in_proj", 0), "in_proj_z": ("in_proj", 1),
              "in_proj_b": ("in_proj", 2), "in_proj_a": ("in_proj", 3)}
    # multimodal checkpoints nest the decoder under model.language_model; we serve text only,
    # so the vision tower and the multi-token-prediction head are not loaded
    rename = {"model.language_model.": "model."}
    skip_prefixes = ("model.visual.", "mtp.")

    def __init__(self, config):
        super().__init__(config, DecoderModel(
            config, lambda i, rotary: qwen3_5_layer(config, config.layer_types[i], rotary), zero_centered=True))
