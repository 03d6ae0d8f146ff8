"""Torch reference implementations: the definition of what each kernel must compute."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from triton_omni.runtime.device import upload


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             zero_centered: bool = False):
    """norm(x [+ residual]) in fp32; returns (y, new_residual) when a residual is given."""
    if residual is not None:
        x = x + residual
        residual = x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if zero_centered:
        y = (h * (1.0 + weight.float())).to(x.dtype)
    else:
        y = weight * h.to(x.dtype)
    return y if residual is None else (y, residual)


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor):
    """Rotate-half RoPE on the first 2*cos.shape[-1] dims of each head. q: [T, Hq, D], k: [T, Hk, D]."""
    c = cos[positions].unsqueeze(1)   # [T, 1, rd/2]
    s = sin[positions].unsqueeze(1)
    half = cos.shape[-1]

    def rot(x):
        x1, x2, rest = x[..., :half].float(), x[..., half:2 * half].float(), x[..., 2 * half:]
        out = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)
        return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out

    return rot(q), rot(k)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           gated: bool = False) -> torch.Tensor:
    """x @ weight.T (+ bias); `gated`: x is a fused [gate | up] projection, silu(gate) * up first."""
    return F.linear(silu_and_mul(x) if gated else x, weight, bias)


def norm_linear(x, residual, norm_weight, eps, zero_centered, weight, bias=None):
    """linear(rms_norm(x [+ residual])) and the new residual (x + residual; x itself without one)."""
    if residual is None:
        return F.linear(rms_norm(x, norm_weight, eps, None, zero_centered), weight, bias), x
    h, residual = rms_norm(x, norm_weight, eps, residual, zero_centered)
    return F.linear(h, weight, bias), residual


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write k, v [T, H, D] into the paged caches [num_blocks, block_size, H, D]; slot -1 is skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep]
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep]


def qk_norm_rope_store(q, k, v, q_weight, k_weight, eps, zero_centered, cos, sin, positions,
                       k_cache, v_cache, slot_mapping):
    """Per-head RMSNorm of q and k (when weights are given), rotary on both, then k (rotated) and v
    written into the paged caches. Returns the new (q, k)."""
    if q_weight is not None:
        q = rms_norm(q, q_weight, eps, None, zero_centered)
        k = rms_norm(k, k_weight, eps, None, zero_centered)
    q, k = rotary(q, k, cos, sin, positions)
    store_kv(k, v, k_cache, v_cache, slot_mapping)
    return q, k


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


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           max_context_len: int) -> torch.Tensor:
    """One query token per sequence against its paged context. q: [B, Hq, D] -> [B, Hq, D]."""
    B, Hq, D = q.shape
    block_size, Hk = k_cache.shape[1], k_cache.shape[2]
    pos = torch.arange(max_context_len, device=q.device)
    slots = block_tables[:, pos // block_size].long() * block_size + pos % block_size   # [B, L]
    k = k_cache.view(-1, Hk, D)[slots].float()                                          # [B, L, Hk, D]
    v = v_cache.view(-1, Hk, D)[slots].float()
    qg = q.float().view(B, Hk, Hq // Hk, D)
    scores = torch.einsum("bhgd,blhd->bhgl", qg, k) * scale
    valid = pos[None, :] < context_lens[:, None]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    out = torch.einsum("bhgl,blhd->bhgd", scores.softmax(-1), v)
    return out.reshape(B, Hq, D).to(q.dtype)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int],
                      scale: float) -> torch.Tensor:
    """Causal attention within each of the packed sequences (some may be empty). q: [T, Hq, D], k/v: [T, Hk, D]."""
    out, start = [], 0
    for n in filter(None, seq_lens):
        qs, ks, vs = (t[start:start + n].transpose(0, 1) for t in (q, k, v))
        out.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale,
                                                  enable_gqa=True).transpose(0, 1))
        start += n
    return torch.cat(out, dim=0)


# --- a decode step's per-row bookkeeping (the engine's state lives on the device, one row a sequence)
FINISH_NONE, FINISH_STOP, FINISH_LENGTH = 0, 1, 2


def decode_inputs(rows: torch.Tensor, position: torch.Tensor, last_token: torch.Tensor,
                  block_tables: torch.Tensor, scratch: int, block_size: int):
    """Gather a decode step's inputs from the per-row state. rows [B] int64 (`scratch`: padding) ->
    positions [B] int64, cache slots [B] int64 (-1 for padding), context lengths [B] int32 (0 for
    padding), block tables [B, max_blocks] int32, the tokens to feed [B] int64."""
    pos = position[rows]
    valid = rows != scratch
    block = block_tables[rows, pos // block_size].long()
    slots = torch.where(valid, block * block_size + pos % block_size, -1)
    return pos, slots, torch.where(valid, pos + 1, 0).int(), block_tables[rows], last_token[rows]


def decode_finish(tokens: torch.Tensor, rows: torch.Tensor, out_count: torch.Tensor, min_tokens: torch.Tensor,
                  max_tokens: torch.Tensor, stop_ids: torch.Tensor, last_token: torch.Tensor, position: torch.Tensor,
                  scratch: int, out: torch.Tensor, advance: bool, write_token: bool) -> None:
    """After sampling tokens [B] for rows [B]: each row's finish code into out[-1] (FINISH_STOP: a stop
    id [rows, S] (-1: none) after min_tokens outputs; FINISH_LENGTH: max_tokens reached), its token
    into out[0] (`write_token`), and its state advanced: last token, output count and, with `advance`
    (a decode step), its position, except for the padding row."""
    count = out_count[rows] + 1
    stop = (tokens[:, None] == stop_ids[rows]).any(-1) & (count > min_tokens[rows])
    code = torch.where(stop, FINISH_STOP, torch.where(count >= max_tokens[rows], FINISH_LENGTH, FINISH_NONE))
    last_token[rows] = tokens
    out_count[rows] = count
    if advance:
        pos = position[rows]
        position[rows] = torch.where(rows != scratch, pos + 1, pos)
    if write_token:
        out[0] = tokens
    out[-1] = code
