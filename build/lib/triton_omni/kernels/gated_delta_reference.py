"""Torch references of kernels.gated_delta: the definition of what each kernel must compute."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from triton_omni.kernels.norms_reference import rms_norm
from triton_omni.runtime.device import upload


def causal_windows(x: torch.Tensor, ends: torch.Tensor, positions: torch.Tensor, width: int) -> torch.Tensor:
    """The `width` rows of packed prompts x [T, C] that end at each row of `ends` [N], oldest first ->
    [N, width, C]. positions [T]: each token's position in its prompt; rows before an end's prompt
    starts are zero, so packed prompts do not see each other."""
    offsets = torch.arange(1 - width, 1, device=x.device)
    valid = (positions[ends][:, None] + offsets >= 0).to(x.dtype)
    return x[(ends[:, None] + offsets).clamp(min=0)] * valid[..., None]


def causal_conv1d_prefill(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The depthwise causal conv + silu over packed prompts. x [T, C]; weight [C, K]; positions [T]: each
    token's position in its prompt (see causal_windows) -> [T, C] in x's dtype."""
    windows = causal_windows(x, torch.arange(x.shape[0], device=x.device), positions, weight.shape[1])
    return F.silu(torch.einsum("tkc,ck->tc", windows, weight))                       # windows [T, K, C]


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                         slots: torch.Tensor) -> torch.Tensor:
    """One decode step of a depthwise causal conv + silu. x [B, C] new inputs; conv_state [S, C, K-1]
    (the previous K-1 inputs of each slot, shifted in place); weight [C, K] -> [B, C]."""
    windows = torch.cat([conv_state[slots], x[:, :, None].to(conv_state.dtype)], dim=-1)   # [B, C, K]
    conv_state[slots] = windows[..., 1:]
    return F.silu(torch.einsum("bck,ck->bc", windows, weight))


def gated_delta_decode(q, k, v, a, b, A_log, dt_bias, state, slots, z, norm_weight, eps):
    """One decode step of Gated DeltaNet (Qwen3.5's linear attention) with its gated output norm.

    q, k [B, Hk, dk], v [B, Hv, dv], z [B, Hv, dv]: conv outputs and the gate, model dtype; a, b [B, Hv]:
    the decay and write-strength projections; state [S, Hv, dk, dv] fp32, updated in place at slots.
    Each key head serves Hv / Hk consecutive value heads. Returns [B, Hv, dv] in v's dtype."""
    Hv, dk = v.shape[1], q.shape[-1]
    rep = Hv // q.shape[1]
    qf = (l2norm(q.float()) * dk ** -0.5).repeat_interleave(rep, dim=1)
    kf = l2norm(k.float()).repeat_interleave(rep, dim=1)
    beta = b.sigmoid().float()
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    s = state[slots] * g.exp()[..., None, None]
    delta = (v.float() - torch.einsum("bhk,bhkv->bhv", kf, s)) * beta[..., None]
    s = s + kf[..., :, None] * delta[..., None, :]
    state[slots] = s
    o = torch.einsum("bhk,bhkv->bhv", qf, s).to(v.dtype)
    return (rms_norm(o, norm_weight, eps).float() * F.silu(z.float())).to(v.dtype)


# ----------------------------------------------------------- Gated DeltaNet prefill (chunked delta rule)

DELTA_CHUNK = 64    # tokens per chunk of the delta rule's prefill (as the reference implementations)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
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
        sizes = [len(gather), T, len(unsort)]
        gather, scatter, unsort = upload(torch.cat([gather, scatter, unsort]), device).split(sizes)
        return cls(gather, scatter, unsort, has.sum(1).tolist(), chunk_size)


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


def gated_delta_prefill(q, k, v, a, b, A_log, dt_bias, layout: ChunkLayout):
    """Gated DeltaNet over packed prompts, each from an empty state (Qwen3.5's linear attention in
    prefill). q, k [T, Hk, dk], v [T, Hv, dv]: conv outputs, model dtype; a, b [T, Hv]: the decay and
    write-strength projections; `layout`: the prompts' ChunkLayout. Each key head serves Hv / Hk
    consecutive value heads. Returns (outputs [T, Hv, dv], each prompt's last state [S, Hv, dk, dv]),
    both fp32. The delta rule runs in fp32 on unit-length q/k (q also scaled by 1/sqrt(dk))."""
    dk, rep = q.shape[-1], v.shape[1] // q.shape[1]
    q = (l2norm(q.float()) * dk ** -0.5).repeat_interleave(rep, dim=1)
    k = l2norm(k.float()).repeat_interleave(rep, dim=1)
    beta = b.sigmoid().float()                                                     # write strength in (0, 1)
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())             # log decay <= 0
    return chunk_gated_delta_rule(q, k, v.float(), g, beta, layout)
