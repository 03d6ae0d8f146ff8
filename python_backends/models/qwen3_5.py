"""Qwen3.5 text decoder for the AR engine; parameter names match `Qwen3_5ForCausalLM` checkpoints
(and the language model inside `Qwen3_5ForConditionalGeneration` ones).

A hybrid: `config.layer_types` makes each layer either
- "linear_attention": Gated DeltaNet. A short causal depthwise conv over [q|k|v], then the gated
  delta rule, whose per-sequence state S [value_heads, key_dim, value_dim] replaces a KV cache:
      S_t = a_t S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - a_t S_{t-1}^T k_t),   o_t = S_t^T q_t
  with decay a_t = exp(g_t). Prefill runs it chunk-parallel, decode one step for all sequences.
- "full_attention": softmax attention over the paged KV cache whose output is gated by
  sigmoid(gate) (q_proj yields query and gate), with q/k RMSNorm and partial rotary (the first
  `partial_rotary_factor` of each head). Its mrope reduces to plain 1-D rope for text: all three
  position components are the token's position, so every frequency sees that same position.
All RMSNorms but the DeltaNet output norm are zero-centred (scale by 1 + weight).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kernels import dispatch
from python_backends.models.attention import PagedAttention
from python_backends.models.context import ForwardContext, RecurrentStateSpec
from python_backends.models.decoder import PACKED, CausalLM, DecoderLayer, DecoderModel
from python_backends.models.layers import GatedMLP, Linear, MergedLinear, RMSNorm, RotaryEmbedding
from python_backends.runtime.device import upload

CHUNK = 64          # tokens per chunk of the delta rule's prefill (as the reference implementations)


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


@dataclass
class ChunkLayout:
    """Where packed tokens go for the chunked delta rule: sequences sorted longest first (stable),
    their chunks of `chunk_size` tokens listed step by step: chunk 0 of every sequence, then chunk 1
    of those that have one, and so on. So the sequences still running at step m are the first
    active[m] in that order and their chunks are consecutive, with no empty chunk anywhere."""
    gather: torch.Tensor          # [N * chunk_size]: each chunk slot's packed token, T for a slot past its sequence's end
    scatter: torch.Tensor         # [T]: each packed token's chunk slot
    unsort: torch.Tensor          # [S]: each sequence's place in the longest-first order
    active: list[int]             # per step, sequences with a chunk at it (host)
    chunk_size: int

    @classmethod
    def build(cls, seq_lens: list[int], chunk_size: int, device) -> "ChunkLayout":
        lens = torch.tensor(seq_lens)
        order = torch.sort(lens, descending=True, stable=True).indices
        chunks = -(-lens[order] // chunk_size)                                   # per sequence, longest first
        has = chunks[None, :] > torch.arange(int(chunks[0]))[:, None]            # [step, sequence]
        step, j = has.nonzero(as_tuple=True)                                     # step by step, longest first
        seq = order[j]
        pos = step[:, None] * chunk_size + torch.arange(chunk_size)              # [N, C] position in its sequence
        real = pos < lens[seq][:, None]
        T = int(lens.sum())
        gather = torch.where(real, (lens.cumsum(0) - lens)[seq][:, None] + pos, T).flatten()
        real = real.flatten()
        scatter = torch.empty(T, dtype=torch.long)
        scatter[gather[real]] = torch.arange(gather.numel())[real]
        unsort = torch.empty_like(order)
        unsort[order] = torch.arange(len(order))
        return cls(upload(gather, device), upload(scatter, device), upload(unsort, device), has.sum(1).tolist(),
                   chunk_size)


def chunk_gated_delta_rule(q, k, v, g, beta, layout: ChunkLayout):
    """The delta rule over packed sequences that each start from an empty state (all fp32).

    q, k: [T, H, dk]; v: [T, H, dv]; g (log decay), beta: [T, H]; `layout`: the packed sequences'
    ChunkLayout. Returns (outputs [T, H, dv], each sequence's state after its last
    token [S, H, dk, dv]).

    Slots past a sequence's end hold zeros, which leave the state as it is (k = 0, beta = 0, no
    decay). Within a chunk, with G_t = g_1 + ... + g_t (Gamma_t = exp(G_t): the decay since the
    chunk start) and S the state before it, the recurrence unrolls to
        (I + A) U = beta V - beta Gamma K S,   A[t, s] = beta_t (k_t . k_s) Gamma_t / Gamma_s  (s < t)
        O = (Gamma Q) S + (Q K^T * D) U,      D[t, s] = Gamma_t / Gamma_s                     (s <= t)
        S' = Gamma_n S + (K * Gamma_n / Gamma)^T U
    All that does not depend on S is computed for every chunk at once: U = Wv - Wk S with
    (I + A) [Wv | Wk] = [beta V | beta Gamma K] (one triangular solve), and O = O0 + E S with
    O0 = (Q K^T * D) Wv, E = Gamma Q - (Q K^T * D) Wk. What is left is a scan over the chunk index,
    all running sequences at once: four batched products per step, whatever the number of sequences.
    """
    T, H, dk = k.shape
    dv, C = v.shape[-1], layout.chunk_size
    packed = q.new_empty(T + 1, H, 2 * dk + dv + 2)         # row T: zeros, for slots past a sequence's end
    torch.cat([q, k, v, g[..., None], beta[..., None]], dim=-1, out=packed[:T])
    packed[T] = 0
    chunks = packed[layout.gather].view(-1, C, H, packed.shape[-1]).transpose(1, 2)            # [N, H, C, .]
    del packed                                          # (a large prefill's tensors are GBs: free early)
    qc, kc, vc, gc, bc = chunks.split([dk, dk, dv, 1, 1], dim=-1)
    G = gc.cumsum(-2)                                                                           # [N, H, C, 1]
    gamma = G.exp()
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    # decay between token s and token t; masked before exp so the upper triangle cannot overflow
    D = (G - G.transpose(-1, -2)).masked_fill(~causal, float("-inf")).exp()                    # [N, H, C, C]
    A = bc * (kc @ kc.transpose(-1, -2)) * D            # only its strict lower triangle is read
    W = torch.linalg.solve_triangular(A, torch.cat([bc * vc, bc * gamma * kc], dim=-1), upper=False,
                                      unitriangular=True)
    Wv, Wk = W.split([dv, dk], dim=-1)
    P = (qc @ kc.transpose(-1, -2)) * D
    out = P @ Wv                                        # O0, then O: written step by step below
    E = qc * gamma - P @ Wk                                                                     # [N, H, C, dk]
    last = G[:, :, -1:]                                                                         # [N, H, 1, 1]
    KG = (kc * (last - G).exp()).transpose(-1, -2)                                              # [N, H, dk, C]
    decay = last.exp()
    S = len(layout.unsort)
    final = q.new_empty(S, H, dk, dv)                   # longest-first order
    state, running, first = q.new_zeros(S * H, dk, dv), S, 0
    for a in layout.active:
        if a < running:                                 # sequences a..running-1 ended at the last step
            final[a:running] = state[a * H:].view(-1, H, dk, dv)
            state, running = state[:a * H], a
        rows = slice(first, first + a)
        U = torch.baddbmm(Wv[rows].reshape(a * H, C, dv), Wk[rows].reshape(a * H, C, dk), state, alpha=-1)
        o = out[rows].view(a * H, C, dv)
        o.baddbmm_(E[rows].reshape(a * H, C, dk), state)
        state = torch.baddbmm(state * decay[rows].reshape(a * H, 1, 1), KG[rows].reshape(a * H, dk, C), U)
        first += a
    final[:running] = state.view(running, H, dk, dv)
    rows = out.transpose(1, 2).reshape(-1, H, dv)                                               # slot order
    return rows[layout.scatter], final[layout.unsort]


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
        last = ctx.cu_seqlens[1:].long() - 1
        offsets = torch.arange(2 - self.kernel_size, 1, device=x.device)
        rows = last[:, None] + offsets                                               # [S, K - 1]
        valid = (positions[last][:, None] + offsets >= 0).to(x.dtype)
        window = x[rows.clamp(min=0)] * valid[..., None]                             # [S, K - 1, C]
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
        # the delta rule runs in fp32 on unit-length q/k (q also scaled by 1/sqrt(dk))
        q = _l2norm(q.float().view(T, self.num_k_heads, self.head_k_dim)) * self.head_k_dim ** -0.5
        k = _l2norm(k.float().view(T, self.num_k_heads, self.head_k_dim))
        v = v.float().view(T, self.num_v_heads, self.head_v_dim)
        # each key head serves num_v_heads / num_k_heads consecutive value heads
        rep = self.num_v_heads // self.num_k_heads
        q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)
        beta = b.sigmoid().float()                                             # write strength in (0, 1)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())   # log decay <= 0
        layout = ctx.memo.get("delta_rule_chunks")
        if layout is None:      # the same for every layer of this forward: built and uploaded once
            layout = ctx.memo["delta_rule_chunks"] = ChunkLayout.build(ctx.seq_lens, CHUNK, q.device)
        o, states = chunk_gated_delta_rule(q, k, v, g, beta, layout)
        self.ssm_state.index_copy_(0, ctx.state_slots, states)
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


def qwen3_5_layer(config, layer_type: str, rotary: RotaryEmbedding) -> DecoderLayer:
    """A Gated DeltaNet layer or a gated attention layer, as `config.layer_types` says."""
    if layer_type == "linear_attention":
        mixer, name = Qwen3_5GatedDeltaNet(config), "linear_attn"
    elif layer_type == "full_attention":
        mixer, name = Qwen3_5Attention(config, rotary), "self_attn"
    else:
        raise ValueError(f"unknown Qwen3.5 layer type {layer_type!r}")
    return DecoderLayer(config, mixer, GatedMLP(config.hidden_size, config.intermediate_size), mixer_name=name,
                        zero_centered=True)


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
