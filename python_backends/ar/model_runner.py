"""Runs the model for one scheduled batch: owns the caches and the per-sequence device state.

Everything a decode step needs lives on the device, indexed by the sequence's row: its block table,
position, last token, sampling parameters, stop ids and output count. A decode step therefore
uploads only the list of rows (and only when the batch changes), runs forward + sampling + stop
check entirely on the device (one CUDA graph per batch-size bucket on GPU), and starts a single
device-to-host copy of [token, finish code] per row, which the engine reads one step later.

Row `max_num_seqs` is a scratch row: graph batches are padded with it (its slot mapping is -1 and
its context empty, so padding never touches a real sequence's cache or state).

Frame models (a TTS talker: see `FrameModel`) decode the same way, except that a step's input is an
embedding the model builds from the row's previous frame and its own per-row device state, and a
step's output is a frame of N codes (code 0 is what stop ids and EOS are checked against). The
step's result is then [N + 1, B] instead of [2, B]; everything stays on the device, so the step is
captured in a CUDA graph just like a text model's.

A runner built with `prompt_embeds` takes text prompts with spliced embeddings and their own rotary
positions (ar/prompt_embeds.py says how they run); one built without is unchanged by them.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np
import torch
from torch import nn

from triton_omni.kernels import dispatch
from triton_omni.ar import bookkeeping_dispatch
from triton_omni.ar import prompt_embeds as spliced
from triton_omni.ar.config import EngineConfig
from triton_omni.ar.logits_processors import MAX_TOP, Features, RowLogits
from triton_omni.ar.sampling import sample
from triton_omni.ar.sequence import Sequence
from triton_omni.models.context import AttentionCacheSpec, ForwardContext, RecurrentStateSpec
from triton_omni.runtime.device import upload

MAX_STOP_IDS = 16           # eos + stop_token_ids per request (validated in SamplingParams)
GREEDY, SAMPLE, FILTERED = "greedy", "sample", "filtered"


def cache_layers(model: nn.Module) -> list[tuple[nn.Module, object]]:
    """Every module that declares a cache (`cache_spec()`), in order."""
    return [(m, m.cache_spec()) for m in model.modules() if hasattr(m, "cache_spec")]


Pick = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]     # (logits [B, V], steps [B]) -> ids [B]


class FrameModel(Protocol):
    """What a model implements, besides forward(inputs_embeds, positions, ctx), to be decoded by the
    engine one frame of `num_codes` codes per step. The model keeps its per-row state itself, indexed
    by the engine's row (0..rows-1; the last is the scratch row), all on the device."""
    num_codes: int

    def allocate_rows(self, rows: int, batch: int, max_steps: int) -> None:
        """Per-row state for `rows` rows, and room for decode batches of up to `batch` rows (before any
        CUDA graph is captured); no row decodes more than `max_steps` steps."""

    def admit_row(self, row: int, prompt: Any) -> None:
        """A new request in `row`: reset its state from its prompt (Sequence.prompt)."""

    def prefill_embeds(self, prompts: list[Any]) -> torch.Tensor:
        """The prompts' input embeddings, packed [sum len, H]."""

    def decode_embeds(self, rows: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """The next input [B, H] of each row (`count` [B]: frames sampled so far), from its last frame."""

    def sample_frame(self, hidden: torch.Tensor, rows: torch.Tensor, count: torch.Tensor, pick: Pick) -> torch.Tensor:
        """The rows' next frame [B, N] from the last hidden state [B, H] (and remember it for
        `decode_embeds`). `pick(logits, steps)` is the engine's sampler with the rows' parameters: a
        request's draws are a function of (seed, step), so the model gives each code its own step."""


@dataclass
class StepHandle:
    """A launched step: its sequences and the pending copy of its results."""
    seqs: list[Sequence]
    host: torch.Tensor                  # [N + 1, B] int64: token (N = 1) or frame codes, then finish code
    event: torch.cuda.Event | None
    host_logprobs: tuple[torch.Tensor, torch.Tensor] | None = None   # [B, 1 + MAX_TOP] values, [B, MAX_TOP] ids

    def result(self) -> tuple[list, list[int]]:
        """Per row: its token (a text model) or its frame, a list of N codes (a frame model); its finish code."""
        if self.event is not None:
            self.event.synchronize()
        *tokens, codes = self.host.tolist()
        return (tokens[0] if len(tokens) == 1 else [list(f) for f in zip(*tokens)]), codes

    def logprobs(self):
        """(row i, k) -> (the chosen token's logprob, [(id, logprob)] of the k most likely), after result()."""
        if self.host_logprobs is None:
            return lambda i, k: None
        values, ids = (t.tolist() for t in self.host_logprobs)
        return lambda i, k: (values[i][0], list(zip(ids[i][:k], values[i][1:1 + k])))


class ModelRunner:
    def __init__(self, model: nn.Module, config: EngineConfig, device: torch.device, dtype: torch.dtype,
                 vocab_size: int | None = None, think_ids: tuple[int, int] | None = None, prompt_embeds: bool = False):
        self.model, self.config, self.device, self.dtype = model, config, device, dtype
        self.cuda = device.type == "cuda"
        self.layers = cache_layers(model)
        self.frame_model = hasattr(model, "sample_frame")
        # spliced prompt embeddings: prefill from embeddings, rotary positions of `rope_axes` rows
        self.spliced = prompt_embeds and not self.frame_model
        self.rope_axes, self.hidden_size = (model.rope_axes, model.config.hidden_size) if self.spliced else (0, 0)
        self.num_codes = model.num_codes if self.frame_model else 1
        self.num_blocks = config.num_kv_blocks or self._default_num_blocks()
        self.max_blocks_per_seq = -(-config.max_model_len // config.block_size)
        self.scratch = config.max_num_seqs                   # the padding row
        rows = config.max_num_seqs + 1
        self._allocate_caches(rows)
        z = lambda *shape, dt=torch.int64: torch.zeros(shape, dtype=dt, device=device)  # noqa: E731
        # per-row state
        self.block_tables = z(rows, self.max_blocks_per_seq, dt=torch.int32)
        self.position = z(rows)             # position of the token the next decode step feeds
        self.last_token = z(rows)
        self.out_count = z(rows)            # tokens sampled so far
        self.max_tokens = z(rows)
        self.min_tokens = z(rows)
        self.stop_ids = torch.full((rows, MAX_STOP_IDS), -1, dtype=torch.int64, device=device)
        self.temperature = z(rows, dt=torch.float32)
        self.top_k = z(rows)
        self.top_p = torch.ones(rows, device=device)
        self.seeds = z(rows)
        self.rope_delta = z(rows) if self.spliced else None     # decode's rotary position - its cache position
        # decode inputs: the rows of the batch, padded with the scratch row
        self.graph_sizes = sorted({b for b in config.cuda_graph_batch_sizes if b <= config.max_num_seqs})
        self.max_batch = max([config.max_num_seqs, *self.graph_sizes])
        self.rows = torch.full((self.max_batch,), self.scratch, dtype=torch.int64, device=device)
        self.out = z(self.num_codes + 1, self.max_batch)
        # a frame model's first-frame graphs read their rows and the prompts' last hidden states here
        self.first_rows, self.first_hidden = self.rows.clone(), None
        if self.frame_model:
            model.allocate_rows(rows, self.max_batch, config.max_model_len)
            with torch.no_grad():               # a decoder's hidden states are as wide as its input embeddings
                embeds = model.decode_embeds(self.rows[:1], self.out_count[:1])
            self.first_hidden = embeds.new_zeros((self.max_batch, embeds.shape[-1]))
        # a text model's logits processors (penalties, bias, grammar masks, reasoning budget, logprobs)
        self.logits = None if self.frame_model or vocab_size is None else \
            RowLogits(rows, vocab_size, self.max_batch, device, think_ids)
        if self.logits is not None:     # where the host writes grammar masks before they go to the device
            self.mask_staging = torch.zeros((rows, self.logits.words), dtype=torch.int32, pin_memory=self.cuda)
            self.mask_uploaded: torch.cuda.Event | None = None
            self.host_logprobs = [(torch.empty((self.max_batch, 1 + MAX_TOP), pin_memory=self.cuda),
                                   torch.empty((self.max_batch, MAX_TOP), dtype=torch.int64, pin_memory=self.cuda))
                                  for _ in range(2)]
        self._rows_key: tuple[int, ...] = ()
        # (bucket, variant, first frame, logits features)
        self.graphs: dict[tuple[int, str, bool, Features], torch.cuda.CUDAGraph] = {}
        self.graph_pool = None
        # prefill as CUDA graphs, one per token-count bucket (_prefill_graph); their static inputs, laid
        # out in `_prefill_layout`, are allocated when first loaded
        self.prefill_sizes = config.prefill_graph_sizes()
        self.prefill_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.prefill_meta: torch.Tensor | None = None         # ids, positions, slots, last index, cu_seqlens, rows
        self.prefill_embeds: torch.Tensor | None = None       # a frame model's input embeddings
        # two pinned result buffers, alternating: the engine reads one while the next step fills the other.
        # Flat, so that a step's [rows, batch] result lands in a contiguous view: a copy into a strided
        # host view is not asynchronous (the engine thread waited there for the step in flight).
        self.host_out = [torch.empty(((self.num_codes + 1) * self.max_batch,), dtype=torch.int64, pin_memory=self.cuda)
                         for _ in range(2)]
        self._next_host = 0

    # -- caches -------------------------------------------------------------------------------
    def _kv_bytes_per_block(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return sum(2 * self.config.block_size * s.num_kv_heads * s.head_dim * itemsize
                   for _, s in self.layers if isinstance(s, AttentionCacheSpec))

    def _default_num_blocks(self) -> int:
        per_seq = -(-self.config.max_model_len // self.config.block_size)
        full = self.config.max_num_seqs * per_seq
        if self.device.type != "cuda":
            return full
        free, total = torch.cuda.mem_get_info(self.device)
        budget = free - (1 - self.config.gpu_memory_utilization) * total
        return max(min(full, int(budget // max(self._kv_bytes_per_block(), 1))), per_seq)

    def _allocate_caches(self, rows: int) -> None:
        bs = self.config.block_size
        for module, spec in self.layers:
            if isinstance(spec, AttentionCacheSpec):
                shape = (self.num_blocks, bs, spec.num_kv_heads, spec.head_dim)
                module.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
                module.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            elif isinstance(spec, RecurrentStateSpec):
                module.conv_state = torch.zeros((rows, *spec.conv_shape), dtype=self.dtype, device=self.device)
                module.ssm_state = torch.zeros((rows, *spec.state_shape), dtype=torch.float32, device=self.device)
            else:
                raise TypeError(f"unknown cache spec {spec!r}")

    def upload(self, values, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return upload(values, self.device, dtype)

    # -- per-sequence state -------------------------------------------------------------------
    def admit(self, seqs: list[Sequence], eos_token_ids: set[int]) -> None:
        """The new sequences' rows of device state, in one upload and a few scatters for all of them.
        (Element by element it was ~10 tiny copies a sequence, and the first scalar assignment waited
        for the step in flight: ~25 ms of the engine thread per wave of 64 requests in a py-spy of a
        server on an H200.)"""
        # one row per sequence: these scalars, in this order, then its stop ids, then its block table
        scalars = (self.position, self.out_count, self.max_tokens, self.min_tokens, self.top_k, self.seeds)
        ints, floats = [], []
        for seq in seqs:
            p = seq.params
            stops = (list(p.stop_token_ids) + ([] if p.ignore_eos else sorted(eos_token_ids)))[:MAX_STOP_IDS]
            blocks = list(seq.block_table)
            ints.append([seq.prompt_len, 0, p.max_tokens, p.min_tokens, p.top_k, p.seed]
                        + stops + [-1] * (MAX_STOP_IDS - len(stops))
                        + blocks + [0] * (self.max_blocks_per_seq - len(blocks)))
            floats.append([p.temperature, p.top_p])
        rows = self.upload([seq.row for seq in seqs])
        ints, floats = self.upload(ints), self.upload(floats, torch.float32)
        for i, state in enumerate(scalars):
            state[rows] = ints[:, i]
        stop_start = len(scalars)
        self.stop_ids[rows] = ints[:, stop_start:stop_start + MAX_STOP_IDS]
        self.block_tables[rows] = ints[:, stop_start + MAX_STOP_IDS:].int()
        self.temperature[rows] = floats[:, 0]
        self.top_p[rows] = floats[:, 1]
        if self.frame_model:
            for seq in seqs:
                self.model.admit_row(seq.row, seq.prompt)
        if self.logits is not None:
            self.logits.admit(seqs, rows, self.upload)
        if self.spliced:                    # a fork decodes at its parent's rotary positions
            self.rope_delta[rows] = self.upload([spliced.rope_delta_of(s) for s in seqs])

    def load_masks(self, seqs: list[Sequence]) -> None:
        """The grammar masks of these rows' next tokens, computed on the host, into the device's buffer
        (before the step that reads them is launched)."""
        if self.mask_uploaded is not None:
            self.mask_uploaded.synchronize()             # the staging rows' last upload is done
        for i, seq in enumerate(seqs):
            seq.matcher.fill(self.mask_staging, i)
        rows = self.upload([s.row for s in seqs])
        self.logits.bitmask.index_copy_(0, rows, self.mask_staging[:len(seqs)].to(self.device, non_blocking=True))
        if self.cuda:
            self.mask_uploaded = torch.cuda.Event()
            self.mask_uploaded.record()

    def features(self, seqs: list[Sequence]) -> Features:
        return Features() if self.logits is None else Features.of(seqs)

    @staticmethod
    def variant(seqs: list[Sequence]) -> str:
        if all(s.params.temperature == 0 for s in seqs):
            return GREEDY
        if any(s.params.temperature > 0 and (s.params.top_k > 0 or s.params.top_p < 1.0 or s.params.min_p > 0)
               for s in seqs):
            return FILTERED
        return SAMPLE

    # -- device work ----------------------------------------------------------------------------
    def _picker(self, rows: torch.Tensor, variant: str, features: Features = Features()) -> Pick:
        """The rows' sampler: argmax, or the seeded sampler with each row's parameters."""
        if variant == GREEDY:
            return lambda logits, steps: bookkeeping_dispatch.argmax(logits)
        t, k, p, seeds = self.temperature[rows], self.top_k[rows], self.top_p[rows], self.seeds[rows]
        f = variant == FILTERED
        min_p = self.logits.min_p[rows] if features.min_p else None
        return lambda logits, steps: sample(logits, t, k, p, seeds, steps, f, f, min_p)

    def _sample_and_check(self, hidden: torch.Tensor, rows: torch.Tensor, variant: str, out: torch.Tensor,
                          advance: bool = False, features: Features = Features()) -> torch.Tensor:
        """Next tokens (frames) into out [N + 1, B], then each row's finish code; the rows' device
        state advanced (`advance`: a decode step's, which moves the positions too). Returns out."""
        pick = self._picker(rows, variant, features)
        if self.frame_model:
            frame = self.model.sample_frame(hidden, rows, self.out_count[rows], pick)
            out[:-1] = frame.T
            tokens = frame[:, 0]                # code 0 decides stops, as a text model's token does
        else:
            steps = None if variant == GREEDY else self.out_count[rows]
            logits = self.model.compute_logits(hidden)
            if features == Features():
                tokens = pick(logits, steps)
            else:
                tokens = self.logits.sample(logits, rows, features, lambda x: pick(x, steps))
        bookkeeping_dispatch.decode_finish(tokens, rows, self.out_count, self.min_tokens, self.max_tokens,
                                           self.stop_ids, self.last_token, self.position, self.scratch, out,
                                           advance, write_token=not self.frame_model)
        return out

    def _decode_body(self, bs: int, variant: str, max_context_len: int, features: Features = Features()) -> torch.Tensor:
        rows = self.rows[:bs]
        pos, slots, context_lens, tables, tokens = bookkeeping_dispatch.decode_inputs(
            rows, self.position, self.last_token, self.block_tables, self.scratch, self.config.block_size)
        ctx = ForwardContext(is_prefill=False, slot_mapping=slots, state_slots=rows, block_tables=tables,
                             context_lens=context_lens, max_context_len=max_context_len,
                             rope_positions=pos + self.rope_delta[rows] if self.spliced else None)
        x = self.model.decode_embeds(rows, self.out_count[rows]) if self.frame_model else tokens
        # padding (scratch) rows stay at position 0: advanced, their block index would run off the table
        return self._sample_and_check(self.model(x, pos, ctx), rows, variant, self.out[:, :bs], advance=True,
                                      features=features)

    def _graph(self, bs: int, variant: str, first: bool = False, features: Features = Features()) -> torch.cuda.CUDAGraph:
        """The decode step of `bs` rows as a CUDA graph; `first`: only the first token (a frame model's
        first frame) from the prompts' hidden states. Graphs of logits features beyond the plain
        sampler are captured when a step first needs them."""
        key = (bs, variant, first, features)
        if key not in self.graphs:
            saved = self.rows.clone()
            self.rows.fill_(self.scratch)                       # capture on padding rows only
            self.first_rows.fill_(self.scratch)
            torch.cuda.synchronize(self.device)
            self._graph_body(bs, variant, first, features=features)   # warm-up (kernels compiled, allocations made)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.graph_pool):
                self._graph_body(bs, variant, first, features=features)   # writes self.out
            self.graph_pool = graph.pool()
            self.graphs[key] = graph
            self.rows.copy_(saved)
            self._rows_key = ()
        return self.graphs[key]

    def _graph_of(self, bs: int, variant: str, first: bool, features: Features) -> torch.cuda.CUDAGraph:
        """`_graph`, naming the features only when there are any (the plain graphs' call as before)."""
        return self._graph(bs, variant, first) if features == Features() else self._graph(bs, variant, first, features)

    def _graph_body(self, bs: int, variant: str, first: bool, max_context_len: int = 0,
                    features: Features = Features()) -> torch.Tensor:
        if first:
            return self._sample_and_check(self.first_hidden[:bs], self.first_rows[:bs], variant, self.out[:, :bs],
                                          features=features)
        return self._decode_body(bs, variant, max_context_len, features)

    def capture_graphs(self, variants=(GREEDY, SAMPLE, FILTERED)) -> None:
        """Capture the decode step for every batch-size bucket (GPU, Triton kernels on), the sampler of
        the first token (frame) after prefill, and prefill for every token bucket where it applies."""
        if self.use_prefill_graphs:
            for t in self.prefill_sizes:
                self._prefill_graph(t)
        for bs in self.graph_sizes:
            for v in variants:
                self._graph(bs, v)
                if self.first_hidden is not None:
                    self._graph(bs, v, first=True)

    @property
    def use_graphs(self) -> bool:
        return self.cuda and not self.config.enforce_eager and dispatch.enabled() and bool(self.graph_sizes)

    @property
    def use_prefill_graphs(self) -> bool:
        """Whole prefill steps as graphs: every layer's prefill reads its prompts' lengths on the device.
        Full attention through the varlen kernel; a linear-attention layer through the delta rule's
        kernels (its torch path loops over chunk steps on the host)."""
        def capturable(spec) -> bool:
            if isinstance(spec, AttentionCacheSpec):
                return dispatch.varlen_attention_supported(self.dtype, spec.head_dim, self.device)
            return dispatch.delta_rule_kernel(self.device)

        return self.use_graphs and bool(self.prefill_sizes) and all(capturable(spec) for _, spec in self.layers)

    # -- prefill graphs -------------------------------------------------------------------------
    # A prefill step's forward is ~10 launches per layer, launch-bound for short prompts (tens of ms of
    # host time for a 28-layer model, even in a server where the GPU idles). Replayed as a graph, the
    # prompts are packed into the smallest bucket of `cuda_graph_prefill_tokens` that holds them. The
    # S = max_num_seqs sequence slots of cu_seqlens hold the prompts, then empty ones; the padding tokens
    # come last, as sequence S (causal attention within each packed sequence keeps them away from the
    # prompts; their cache slot is -1: never written; recurrent layers read only the first S, whose
    # state slots are the prompts' rows, then the scratch row).
    def _prefill_layout(self, m: torch.Tensor, t: int) -> tuple[torch.Tensor, ...]:
        """Bucket `t`'s static inputs as views of `m` (the device buffer or its host copy), laid out from
        its start (each graph reads its own offsets): ids, positions and cache slots [t], each prompt's
        last index [S], cu_seqlens [S + 2], state rows [S]; then (spliced prompts) rotary positions
        [rope_axes, t] (`_prefill_rope`). A step thus builds and uploads 3t + 3S + 2 (+ A t) numbers, not
        the largest bucket's."""
        S = self.config.max_num_seqs
        return m[:t], m[t:2 * t], m[2 * t:3 * t], m[3 * t:3 * t + S], m[3 * t + S:3 * t + 2 * S + 2], \
            m[3 * t + 2 * S + 2:3 * t + 3 * S + 2]

    def _prefill_rope(self, m: torch.Tensor, t: int) -> torch.Tensor:
        return m[self._prefill_meta_size(t) - self.rope_axes * t:self._prefill_meta_size(t)].view(self.rope_axes, t)

    def _prefill_meta_size(self, t: int) -> int:
        return (3 + self.rope_axes) * t + 3 * self.config.max_num_seqs + 2

    def _prefill_inputs(self, seqs: list[Sequence], t: int) -> torch.Tensor:
        """The host copy of bucket `t`'s part of `prefill_meta` for these prompts."""
        meta = torch.zeros(self._prefill_meta_size(t), dtype=torch.int64)
        ids, pos, slots, last, cu, rows = self._prefill_layout(meta, t)
        slots.fill_(-1)                                          # padding writes no cache slot
        rows.fill_(self.scratch)
        cu[-1] = t                                               # the padding sequence ends at t
        if seqs:
            packed_ids, packed_pos, packed_slots, packed_cu = self._pack(seqs)
            total, n = int(packed_cu[-1]), len(seqs)
            if packed_ids is not None:
                ids[:total] = packed_ids
            pos[:total] = packed_pos
            slots[:total] = packed_slots
            last[:n] = packed_cu[1:] - 1
            cu[:n + 1] = packed_cu
            cu[n + 1:-1] = total                                 # empty sequences, then the padding
            rows[:n] = torch.tensor([s.row for s in seqs])
            if self.spliced:
                self._prefill_rope(meta, t)[:, :total] = spliced.packed_rope_positions(
                    seqs, packed_pos, packed_cu, self.rope_axes)
        return meta

    def _load_prefill_inputs(self, seqs: list[Sequence], t: int) -> None:
        if self.prefill_meta is None:
            self.prefill_meta = torch.zeros(self._prefill_meta_size(self.prefill_sizes[-1]),
                                            dtype=torch.int64, device=self.device)
            if self.frame_model:
                self.prefill_embeds = self.first_hidden.new_zeros((self.prefill_sizes[-1], self.first_hidden.shape[-1]))
            elif self.spliced:
                self.prefill_embeds = torch.zeros((self.prefill_sizes[-1], self.hidden_size), dtype=self.dtype,
                                                  device=self.device)
        if self.frame_model and seqs:
            total = sum(s.prompt_len for s in seqs)
            self.prefill_embeds[:total].copy_(self.model.prefill_embeds([s.prompt for s in seqs]))
        meta = self._prefill_inputs(seqs, t)
        self.prefill_meta[:len(meta)].copy_(self.upload(meta))
        if self.spliced and seqs:          # the prompts' embeddings, outside the graph: ids from the device copy
            cu = torch.tensor([0] + [s.prompt_len for s in seqs]).cumsum(0)
            spliced.embed_prompts(self.model, self.prefill_meta[:int(cu[-1])], seqs, cu, self.upload, self.prefill_embeds)

    def _prefill_body(self, t: int) -> torch.Tensor:
        """Forward of bucket `t` from the static inputs; the hidden states at each prompt's last token [S, H]."""
        ids, pos, slots, last, cu, rows = self._prefill_layout(self.prefill_meta, t)
        # attention's grid covers max_seqlen rows of every packed sequence: bounded by the longest prompt,
        # not by the bucket (a 32K-token bucket with 64 prompt slots would launch ~260K blocks a layer,
        # nearly all empty). Padding rows past it are left unwritten: their sequence is its own, so
        # nothing real reads them, and their cache slots are -1.
        ctx = ForwardContext(is_prefill=True, slot_mapping=slots, state_slots=rows, cu_seqlens=cu.int(),
                             max_seqlen=min(t, self.config.max_model_len),
                             rope_positions=self._prefill_rope(self.prefill_meta, t) if self.spliced else None)
        return self.model(self.prefill_embeds[:t] if self.prefill_embeds is not None else ids, pos, ctx)[last]

    def bucket_prefill_hidden(self, seqs: list[Sequence], t: int) -> torch.Tensor:
        """What the prefill graph of bucket `t` computes for these prompts, run eagerly (on any device):
        each prompt's last hidden state [n, H]. Tests hold it against prefill_hidden."""
        self._load_prefill_inputs(seqs, t)
        return self._prefill_body(t)[:len(seqs)]

    def _prefill_graph(self, t: int) -> torch.cuda.CUDAGraph:
        """Captured at start only (capture_graphs): its warm-up runs on padding alone."""
        if t not in self.prefill_graphs:
            self._load_prefill_inputs([], t)
            torch.cuda.synchronize(self.device)
            warm = self._prefill_body(t)
            if self.first_hidden is None:               # a text model's: as wide as its hidden states
                self.first_hidden = warm.new_zeros((self.max_batch, warm.shape[-1]))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.graph_pool):
                self.first_hidden[:self.config.max_num_seqs] = self._prefill_body(t)
            self.graph_pool = graph.pool()
            self.prefill_graphs[t] = graph
        return self.prefill_graphs[t]

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> StepHandle:
        n = len(seqs)
        bucket = next((b for b in self.graph_sizes if b >= n), None) if self.use_graphs else None
        bs = bucket or n
        key = tuple(s.row for s in seqs)
        if key != self._rows_key:                          # upload rows only when the batch changed
            rows = torch.full((bs,), self.scratch, dtype=torch.int64)
            rows[:n] = torch.tensor(key, dtype=torch.int64)
            self.rows[:bs].copy_(self.upload(rows))
            self._rows_key = key
        variant, features = self.variant(seqs), self.features(seqs)
        if bucket is not None:
            self._graph_of(bs, variant, False, features).replay()
            result = self.out[:, :n]
        else:
            result = self._decode_body(bs, variant, max(s.prompt_len + s.num_launched for s in seqs), features)[:, :n]
        return self._copy_out(seqs, result, features)

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence], copies: list[tuple[int, int]] = ()) -> StepHandle:
        """Prefill the prompts of `seqs` (forks of n > 1 requests are not prefilled: each follows its
        parent, takes its hidden state, a copy of its partial last block (`copies`) and its recurrent
        state), then sample every sequence's first token."""
        n, variant, features = len(seqs), self.variant(seqs), self.features(seqs)
        prompts = [s for s in seqs if s.parent is None]
        total = sum(s.prompt_len - s.num_cached for s in prompts)
        t = next((t for t in self.prefill_sizes if t >= total), None)
        if t in self.prefill_graphs and not any(s.num_cached for s in prompts):
            self._load_prefill_inputs(prompts, t)
            self.prefill_graphs[t].replay()
            hidden = self.first_hidden[:len(prompts)]            # written by the graph
        else:
            hidden = self.prefill_hidden(prompts)
        if len(prompts) < n:
            hidden = self._fork(seqs, prompts, hidden, copies)
        # the first token (frame) from the prompts' last hidden states: for a frame model ~1,700 small
        # kernels (a code predictor's sub-steps), replayed as a graph of the decode buckets' sizes
        bucket = next((b for b in self.graph_sizes if b >= n), None) \
            if self.use_graphs and self.first_hidden is not None else None
        if bucket is None:
            result = self._sample_and_check(hidden, self.upload([s.row for s in seqs]), variant, self.out[:, :n],
                                            features=features)
        else:
            graph = self._graph_of(bucket, variant, True, features)  # a capture overwrites rows, not first_hidden
            if hidden.data_ptr() != self.first_hidden.data_ptr():
                self.first_hidden[:n].copy_(hidden)
            self.first_rows[:bucket].copy_(self.upload([s.row for s in seqs] + [self.scratch] * (bucket - n)))
            graph.replay()
            result = self.out[:, :n]
        self._rows_key = ()
        return self._copy_out(seqs, result, features)

    def _fork(self, seqs: list[Sequence], prompts: list[Sequence], hidden: torch.Tensor,
              copies: list[tuple[int, int]]) -> torch.Tensor:
        """The forks' share of a prefill: their parents' last hidden states (every sequence's, in `seqs`
        order), the partial last blocks copied, the recurrent state copied (ar/forks.py)."""
        if copies:
            src, dst = (self.upload(list(c)) for c in zip(*copies))
            for module, spec in self.layers:
                if isinstance(spec, AttentionCacheSpec):
                    module.k_cache[dst] = module.k_cache[src]
                    module.v_cache[dst] = module.v_cache[src]
        place = {id(p): i for i, p in enumerate(prompts)}
        forks = [s for s in seqs if s.parent is not None]
        src_rows = self.upload([s.parent.row for s in forks])
        dst_rows = self.upload([s.row for s in forks])
        for module, spec in self.layers:
            if isinstance(spec, RecurrentStateSpec):
                module.conv_state[dst_rows] = module.conv_state[src_rows]
                module.ssm_state[dst_rows] = module.ssm_state[src_rows]
        order = self.upload([place[id(s if s.parent is None else s.parent)] for s in seqs])
        return hidden[order]

    def _pack(self, seqs: list[Sequence]) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The prompts packed end to end, as host tensors: token ids (None for a frame model), each
        token's position and cache slot (from its sequence's block table), and cu_seqlens [n + 1].
        Whole-batch tensor ops: built a prompt at a time it took ~5 ms of the engine thread for 32
        prompts of 512 tokens (on a 2-core machine), time in which no step was launched."""
        n, bs = len(seqs), self.config.block_size
        # a prompt's first `num_cached` tokens are in the prefix cache: only the rest is packed
        lens = torch.tensor([s.prompt_len - s.num_cached for s in seqs])
        cu = torch.zeros(n + 1, dtype=torch.int64)
        torch.cumsum(lens, 0, out=cu[1:])
        seq_of = torch.repeat_interleave(torch.arange(n), lens)
        pos = torch.arange(int(cu[-1])) - cu[:-1][seq_of] + torch.tensor([s.num_cached for s in seqs])[seq_of]
        width = max(len(s.block_table) for s in seqs)
        tables = torch.tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs], dtype=torch.int64)
        slots = tables[seq_of, pos // bs] * bs + pos % bs
        ids = None   # numpy reads the lists ~5x faster than torch.tensor(list) (~1 ms for 32K tokens here)
        if not self.frame_model:
            ids = torch.from_numpy(np.fromiter(itertools.chain.from_iterable(s.prompt_ids[s.num_cached:] for s in seqs),
                                               dtype=np.int64, count=int(cu[-1])))
        return ids, pos, slots, cu

    def prefill_hidden(self, seqs: list[Sequence], all_tokens: bool = False) -> torch.Tensor:
        """Forward over the packed prompts; hidden states at each prompt's last token (or at every token)."""
        ids, pos, slots, cu = self._pack(seqs)
        up = self.upload
        new = [s.prompt_len - s.num_cached for s in seqs]
        ctx = ForwardContext(is_prefill=True, slot_mapping=up(slots), state_slots=up([s.row for s in seqs]),
                             seq_lens=new, cu_seqlens=up(cu, torch.int32), max_seqlen=max(new))
        if any(s.num_cached for s in seqs):
            # attention reads the cached prefix from the paged cache (models/attention.py)
            width = max(len(s.block_table) for s in seqs)
            ctx.prefix_lens = [s.num_cached for s in seqs]
            ctx.block_tables = up([s.block_table + [0] * (width - len(s.block_table)) for s in seqs], torch.int32)
            ctx.context_lens = up([s.prompt_len for s in seqs], torch.int32)
            ctx.max_context_len = max(s.prompt_len for s in seqs)
        x = self.model.prefill_embeds([s.prompt for s in seqs]) if self.frame_model else up(ids)
        if self.spliced:
            ctx.rope_positions = up(spliced.packed_rope_positions(seqs, pos, cu, self.rope_axes))
            x = spliced.embed_prompts(self.model, x, seqs, cu, up)
        hidden = self.model(x, up(pos), ctx)
        return hidden if all_tokens else hidden[up(cu[1:] - 1)]

    def prefill_logits(self, seqs: list[Sequence], all_tokens: bool = False) -> torch.Tensor:
        return self.model.compute_logits(self.prefill_hidden(seqs, all_tokens))

    def _copy_out(self, seqs: list[Sequence], result: torch.Tensor, features: Features = Features()) -> StepHandle:
        n = len(seqs)
        if not self.cuda:
            lp = (self.logits.logprob_values[:n].clone(), self.logits.logprob_ids[:n].clone()) if features.logprobs else None
            return StepHandle(seqs, result.clone(), None, lp)
        host = self.host_out[self._next_host][:result.numel()].view(result.shape)
        lp = None
        if features.logprobs:
            values, ids = self.host_logprobs[self._next_host]
            values[:n].copy_(self.logits.logprob_values[:n], non_blocking=True)
            ids[:n].copy_(self.logits.logprob_ids[:n], non_blocking=True)
            lp = (values[:n], ids[:n])
        self._next_host ^= 1
        host.copy_(result.contiguous(), non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return StepHandle(seqs, host, event, lp)
