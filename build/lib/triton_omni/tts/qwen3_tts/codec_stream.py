"""Stateful streaming for the Qwen3-TTS 12 Hz decoder (python_backends/tts/qwen3_tts/codec.py).

Every layer of the decoder is causal, so a stream can decode each new chunk of frames once if it keeps,
between chunks, what the layers would otherwise recompute from the past:

    causal conv (kernel k, dilation d)     its last (k - 1) * d input samples (zeros before the start:
                                           the same zeros the whole decode pads with)
    causal transposed conv (k, stride s)   its last (k - 1) // s input frames (1 for k = 2s, none for k = s)
    transformer layer                      keys (rotated) and values of the last `sliding_window - 1` frames
    the stream                             `pos`, the frames decoded so far: rope positions continue from it,
                                           and slots before frame 0 are masked

`StreamingDecoder.decode` then runs the new T frames through the same weights and returns their
T * 1920 samples, equal to the same samples of a whole-utterance decode up to float rounding (the sums
run over other lengths and in another order). A chunk costs what a fresh T-frame decode costs plus the
state's few samples, whatever the stream's length; the window approach (`ChunkPlan` with
`context_frames()` of left context) re-decodes ~580 frames per chunk at the release size.

`StreamState` holds a batch of streams (rows); `StreamState.stack` / `split` move between one state per
stream and a batch, so streams at different points decode together (the rows only have to share T).
The served codec step (python_backends/tts/qwen3_tts/serve.py) keeps every live stream's state as a row
of one preallocated state instead: `select` gathers a call's rows, `put` writes them back.
At the release size a stream's state is ~5 MB in float32, nearly all of it the transformer's keys/values.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from triton_omni.tts.qwen3_tts.codec import (CausalConv1d, CausalConvTranspose1d, CodecDecoder, ConvNeXtBlock,
                                             DecoderBlock, ResidualUnit, SnakeBeta, _rotate)


@dataclass
class StreamState:
    """The state of B streams; row i of every tensor belongs to stream i."""
    pos: torch.Tensor               # [B] int64: frames decoded so far
    keys: list[torch.Tensor]        # per transformer layer [B, kv_heads, window - 1, head_dim], rotated;
    values: list[torch.Tensor]      # slot j holds frame pos - (window - 1) + j (slots before frame 0: unused)
    convs: list[torch.Tensor]       # per stateful conv, in decode order, [B, channels, history]: its last inputs

    @property
    def batch(self) -> int:
        return self.pos.shape[0]

    def tensors(self) -> list[torch.Tensor]:
        return [self.pos, *self.keys, *self.values, *self.convs]

    @classmethod
    def _from(cls, tensors: list[torch.Tensor], layers: int) -> StreamState:
        return cls(tensors[0], tensors[1:1 + layers], tensors[1 + layers:1 + 2 * layers], tensors[1 + 2 * layers:])

    @classmethod
    def stack(cls, states: list[StreamState]) -> StreamState:
        """Several states (of one or more rows each) as one batch, rows in order."""
        layers = len(states[0].keys)
        return cls._from([torch.cat(ts) for ts in zip(*(s.tensors() for s in states))], layers)

    def split(self) -> list[StreamState]:
        """One single-row state per row. Copies: a stream's state must not keep the whole batch's
        tensors alive after its neighbours have moved on."""
        return [self.select(slice(i, i + 1)) for i in range(self.batch)]

    def select(self, rows: slice | torch.Tensor) -> StreamState:
        """The given rows (a slice or an index tensor), copied."""
        take = (lambda t: t[rows].clone()) if isinstance(rows, slice) else (lambda t: t.index_select(0, rows))
        return StreamState._from([take(t) for t in self.tensors()], len(self.keys))

    def to(self, device: torch.device | str) -> StreamState:
        return StreamState._from([t.to(device) for t in self.tensors()], len(self.keys))

    def put(self, rows: torch.Tensor, other: StreamState) -> None:
        """Write `other`'s first len(rows) rows into the given rows of this state, in place (a server
        keeps every stream's state as a row of one preallocated state: a call gathers its streams' rows
        with `select` and writes them back here, a copy per tensor whatever the number of streams)."""
        for t, new in zip(self.tensors(), other.tensors()):
            t.index_copy_(0, rows, new[:len(rows)])


class StreamingDecoder:
    """Decodes streams chunk by chunk with a `CodecDecoder`'s own weights (nothing copied, nothing
    added). Its layers' forwards are re-walked here with the state threaded through; the decoder's own
    forward (the whole-utterance decode) is untouched."""

    def __init__(self, decoder: CodecDecoder):
        self.decoder = decoder
        tf = decoder.pre_transformer
        if tf.window >= 1 << 30:
            raise ValueError("streaming needs the transformer's sliding_window (a bounded key/value history)")
        self.history = tf.window - 1
        attn = tf.layers[0].self_attn
        self.kv_shape = (attn.kv_heads, self.history, attn.head_dim)
        # each conv with a history -> its slot in StreamState.convs (looked up by module, so the order
        # of StreamState.convs is fixed by the decoder's module order, the same for every state)
        self.slots: dict[nn.Module, int] = {}
        self.conv_shapes: list[tuple[int, int]] = []
        for m in decoder.modules():
            n = _history(m)
            if n:
                self.slots[m] = len(self.conv_shapes)
                self.conv_shapes.append((m.conv.in_channels, n))

    def start(self, batch: int = 1) -> StreamState:
        """Fresh states for `batch` streams (frame 0 next)."""
        p = next(self.decoder.parameters())
        kw = dict(device=p.device, dtype=p.dtype)
        layers = len(self.decoder.pre_transformer.layers)
        return StreamState(torch.zeros(batch, dtype=torch.long, device=p.device),
                           [torch.zeros(batch, *self.kv_shape, **kw) for _ in range(layers)],
                           [torch.zeros(batch, *self.kv_shape, **kw) for _ in range(layers)],
                           [torch.zeros(batch, c, n, **kw) for c, n in self.conv_shapes])

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, state: StreamState) -> tuple[torch.Tensor, StreamState]:
        """codes [B, T, N], each row its stream's next T frames -> (waveform [B, T * 1920], the new
        state). `state` is not modified."""
        b, t, _ = codes.shape
        if b != state.batch:
            raise ValueError(f"{b} rows of codes for a state of {state.batch} streams")
        if t == 0:
            return codes.new_zeros((b, 0), dtype=state.keys[0].dtype), state
        d = self.decoder
        convs = list(state.convs)
        x = self._conv(d.pre_conv, d.quantizer.decode(codes.transpose(1, 2).clamp(min=0)), state.convs, convs)
        x, keys, values = self._transformer(x.transpose(1, 2), state)
        x = x.transpose(1, 2)
        for up, block in d.upsample:
            x = self._run(block, self._run(up, x, state.convs, convs), state.convs, convs)
        for m in d.decoder:
            x = self._run(m, x, state.convs, convs)
        return x.clamp(-1, 1)[:, 0], StreamState(state.pos + t, keys, values, convs)

    # --- convolutions -----------------------------------------------------------------------------
    def _run(self, m: nn.Module, x: torch.Tensor, old: list, new: list) -> torch.Tensor:
        """`m`'s forward on the new samples x, reading its convs' histories from `old` (the state's
        convs) and writing the updated ones to `new` (the next state's), slot by slot."""
        if isinstance(m, CausalConv1d):
            return self._conv(m, x, old, new)
        if isinstance(m, CausalConvTranspose1d):
            return self._conv_transpose(m, x, old, new)
        if isinstance(m, SnakeBeta):
            return m(x)
        if isinstance(m, ConvNeXtBlock):                  # ConvNeXtBlock.forward, dwconv with history
            h = m.norm(self._conv(m.dwconv, x, old, new).transpose(1, 2))
            h = m.gamma * m.pwconv2(F.gelu(m.pwconv1(h)))
            return x + h.transpose(1, 2)
        if isinstance(m, ResidualUnit):                   # ResidualUnit.forward
            h = self._conv(m.conv1, m.act1(x), old, new)
            return x + self._conv(m.conv2, m.act2(h), old, new)
        if isinstance(m, DecoderBlock):
            for sub in m.block:
                x = self._run(sub, x, old, new)
            return x
        raise TypeError(f"no streaming rule for {type(m).__name__}")

    def _conv(self, m: CausalConv1d, x: torch.Tensor, old: list, new: list) -> torch.Tensor:
        if not m.left:
            return m.conv(x)
        i = self.slots[m]
        full = torch.cat([old[i], x], dim=-1)             # the history stands in for the left padding
        new[i] = full[..., -m.left:].clone()
        return m.conv(full)

    def _conv_transpose(self, m: CausalConvTranspose1d, x: torch.Tensor, old: list, new: list) -> torch.Tensor:
        """Output frame f of a transposed conv (stride s, kernel k) sums input frames f - (k-1)//s .. f:
        with those earlier frames prepended, the samples they alone would start are dropped."""
        if m not in self.slots:                           # k <= s: frames do not overlap
            return m(x)
        i, s = self.slots[m], m.conv.stride[0]
        n = old[i].shape[-1]
        full = torch.cat([old[i], x], dim=-1)
        new[i] = full[..., -n:].clone()
        y = m.conv(full)
        return y[..., n * s:y.shape[-1] - m.trim]

    # --- transformer ------------------------------------------------------------------------------
    def _transformer(self, x: torch.Tensor, state: StreamState):
        """CodecTransformer.forward for T new frames [B, T, latent] at positions pos .. pos + T - 1,
        attending to the cached keys/values of the window before them."""
        tf = self.decoder.pre_transformer
        t = x.shape[1]
        steps = torch.arange(t, device=x.device)
        qpos = state.pos[:, None] + steps                                         # [B, T]
        kpos = torch.cat([state.pos[:, None] - self.history + torch.arange(self.history, device=x.device),
                          qpos], dim=1)                                           # [B, history + T]
        dist = qpos[:, :, None] - kpos[:, None, :]
        # the whole decode's mask (causal, within the window), plus: no slots before frame 0
        mask = ((dist >= 0) & (dist < tf.window) & (kpos >= 0)[:, None, :])[:, None]
        freqs = qpos.float()[..., None] * tf.inv_freq.float()                     # as torch.outer does
        cos, sin = freqs.cos()[:, None], freqs.sin()[:, None]                     # [B, 1, T, D/2]
        x = tf.input_proj(x)
        keys, values = [], []
        for layer, k_old, v_old in zip(tf.layers, state.keys, state.values):     # CodecLayer.forward
            a, k, v = self._attention(layer.self_attn, layer.input_layernorm(x), cos, sin, mask, k_old, v_old)
            keys.append(k[:, :, -self.history:].clone())
            values.append(v[:, :, -self.history:].clone())
            x = x + layer.self_attn_layer_scale(a)
            x = x + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(x)))
        return tf.output_proj(tf.norm(x)), keys, values

    @staticmethod
    def _attention(attn, x, cos, sin, mask, k_old, v_old):
        """CodecAttention.forward over [cached keys/values, new ones]; also returns both, concatenated."""
        b, t, _ = x.shape
        q, k, v = (y.view(b, t, -1, attn.head_dim).transpose(1, 2)
                   for y in attn.qkv_proj(x).split(attn.qkv_proj.out_sizes, dim=-1))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k, v = torch.cat([k_old, k], dim=2), torch.cat([v_old, v], dim=2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.head_dim ** -0.5,
                                           enable_gqa=attn.heads != attn.kv_heads)
        return attn.o_proj(o.transpose(1, 2).reshape(b, t, -1)), k, v


def _history(m: nn.Module) -> int:
    """Input samples (frames) of the past that a causal conv (transposed conv) needs; 0 for other modules."""
    if isinstance(m, CausalConv1d):
        return m.left
    if isinstance(m, CausalConvTranspose1d):
        return (m.conv.kernel_size[0] - 1) // m.conv.stride[0]
    return 0


class StatePool:
    """Every live stream's state as a row of one preallocated state, decoded a call at a time: a call
    gathers its rows, decodes their next T frames and writes the rows back. Row `scratch` (the last one)
    belongs to no stream: calls pad to their batch size with it, and its state is garbage.

    On CUDA a call is ~1,300 small kernels (a Python walk over a launch-bound decoder), so each
    (rows, T) shape up to (max(graph_rows), graph_frames) runs as one CUDA graph of the whole call:
    gather, decode, write back. Captured on first use (`capture` does them all up front), replayed
    with the call's row indices and codes copied into static buffers; other shapes (a voice clone's
    reference frames) run eagerly. A graph replays the kernels the eager call would launch, so the
    samples are the same either way."""

    def __init__(self, decoder: StreamingDecoder, max_streams: int, graph_rows: tuple[int, ...] = (),
                 graph_frames: int = 0):
        self.decoder = decoder
        self.states = decoder.start(max_streams + 1)
        self.scratch = max_streams
        self.fresh = decoder.start(1)
        self.device = self.states.pos.device
        self.graph_rows, self.graph_frames = sorted(graph_rows), graph_frames
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None
        if self.graph_rows and graph_frames:
            if self.device.type != "cuda":
                raise ValueError("CUDA graphs need the decoder on a CUDA device")
            n = decoder.decoder.num_quantizers
            self.rows = torch.full((self.graph_rows[-1],), self.scratch, dtype=torch.long, device=self.device)
            self.codes = torch.zeros(self.graph_rows[-1], graph_frames, n, dtype=torch.long, device=self.device)

    def reset(self, row: int) -> None:
        """Row `row` starts a new stream (frame 0 next)."""
        self.states.put(torch.tensor([row], device=self.device), self.fresh)

    @torch.no_grad()
    def decode(self, rows: list[int], codes: torch.Tensor) -> torch.Tensor:
        """codes [B, T, N] (on the pool's device), row i the next T frames of the stream in rows[i]
        (the scratch row for padding) -> waveform [B, T * 1920] on the host; the rows' states advance."""
        b, t = len(rows), codes.shape[1]
        if b in self.graph_rows and 0 < t <= self.graph_frames:
            graph, out = self._graph(b, t)
            self.rows[:b].copy_(torch.tensor(rows), non_blocking=True)
            self.codes[:b, :t].copy_(codes)
            graph.replay()
            return out.cpu()
        index = torch.tensor(rows, device=self.device)
        return self._call(index, codes).cpu()

    def _call(self, index: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        wave, state = self.decoder.decode(codes, self.states.select(index))
        self.states.put(index, state)
        return wave

    def capture(self) -> None:
        for b in self.graph_rows:
            for t in range(1, self.graph_frames + 1):
                self._graph(b, t)

    def _graph(self, b: int, t: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """The (b, t) call's graph and output, captured on the scratch row at first use (a warm-up call
        first: kernels picked, memory made)."""
        if (b, t) in self.graphs:
            return self.graphs[b, t]
        rows, codes = self.rows[:b], self.codes[:b, :t]
        rows.fill_(self.scratch)
        codes.zero_()
        torch.cuda.synchronize(self.device)
        self._call(rows, codes)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._call(rows, codes)
        self._pool = graph.pool()
        self.graphs[b, t] = graph, out
        return graph, out
