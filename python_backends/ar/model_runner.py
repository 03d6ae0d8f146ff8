"""Runs the model for one scheduled batch: builds the step's tensors, owns the caches, samples.

The runner allocates the KV cache (paged blocks, for full-attention layers) and the recurrent
state slots (for linear-attention layers) that the model declares, and binds them to its layers.
Per-sequence sampling parameters live in device tables indexed by the sequence's row, written once
on admission, so a step only uploads the rows it runs.
"""
from __future__ import annotations

import torch
from torch import nn

from python_backends.ar.block_manager import BlockManager
from python_backends.ar.config import EngineConfig
from python_backends.ar.sampling import sample
from python_backends.ar.scheduler import Batch
from python_backends.ar.sequence import Sequence
from python_backends.models.context import AttentionCacheSpec, ForwardContext, RecurrentStateSpec


def cache_layers(model: nn.Module) -> list[tuple[nn.Module, object]]:
    """Every module that declares a cache (`cache_spec()`), in order."""
    return [(m, m.cache_spec()) for m in model.modules() if hasattr(m, "cache_spec")]


class ModelRunner:
    def __init__(self, model: nn.Module, config: EngineConfig, device: torch.device, dtype: torch.dtype):
        self.model, self.config, self.device, self.dtype = model, config, device, dtype
        self.layers = cache_layers(model)
        self.num_blocks = config.num_kv_blocks or self._default_num_blocks()
        self._allocate_caches()
        n = config.max_num_seqs
        self.temperature = torch.zeros(n, device=device)
        self.top_k = torch.zeros(n, dtype=torch.int64, device=device)
        self.top_p = torch.ones(n, device=device)
        self.seeds = torch.zeros(n, dtype=torch.int64, device=device)
        self.uses_top_k = [False] * n
        self.uses_top_p = [False] * n

    # -- caches -------------------------------------------------------------------------------
    def _kv_bytes_per_block(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return sum(2 * self.config.block_size * s.num_kv_heads * s.head_dim * itemsize
                   for _, s in self.layers if isinstance(s, AttentionCacheSpec))

    def _default_num_blocks(self) -> int:
        full = self.config.max_num_seqs * -(-self.config.max_model_len // self.config.block_size)
        if self.device.type != "cuda":
            return full
        per_block = max(self._kv_bytes_per_block(), 1)
        free, total = torch.cuda.mem_get_info(self.device)
        budget = free - (1 - self.config.gpu_memory_utilization) * total
        return max(min(full, int(budget // per_block)), -(-self.config.max_model_len // self.config.block_size))

    def _allocate_caches(self) -> None:
        n_slots, bs = self.config.max_num_seqs, self.config.block_size
        for module, spec in self.layers:
            if isinstance(spec, AttentionCacheSpec):
                shape = (self.num_blocks, bs, spec.num_kv_heads, spec.head_dim)
                module.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
                module.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            elif isinstance(spec, RecurrentStateSpec):
                module.conv_state = torch.zeros((n_slots, *spec.conv_shape), dtype=self.dtype, device=self.device)
                module.ssm_state = torch.zeros((n_slots, *spec.state_shape), dtype=torch.float32, device=self.device)
            else:
                raise TypeError(f"unknown cache spec {spec!r}")

    # -- per-sequence tables ------------------------------------------------------------------
    def admit(self, seq: Sequence) -> None:
        p, r = seq.params, seq.row
        self.temperature[r] = p.temperature
        self.top_k[r] = p.top_k
        self.top_p[r] = p.top_p
        self.seeds[r] = p.seed
        self.uses_top_k[r] = p.top_k > 0 and p.temperature > 0
        self.uses_top_p[r] = p.top_p < 1.0 and p.temperature > 0

    # -- one step -----------------------------------------------------------------------------
    def _tensor(self, values, dtype=torch.int64) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, pin_memory=self.device.type == "cuda").to(self.device, non_blocking=True)

    def prepare_prefill(self, seqs: list[Sequence], blocks: BlockManager):
        ids, pos, slots = [], [], []
        for s in seqs:
            n = len(s.prompt_ids)
            ids += s.prompt_ids
            pos += range(n)
            slots += [blocks.slot(s, i) for i in range(n)]
        lens = [len(s.prompt_ids) for s in seqs]
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        ctx = ForwardContext(is_prefill=True, slot_mapping=self._tensor(slots),
                             state_slots=self._tensor([s.state_slot for s in seqs]),
                             seq_lens=lens, cu_seqlens=self._tensor(cu, torch.int32))
        last = self._tensor([c - 1 for c in cu[1:]])
        return self._tensor(ids), self._tensor(pos), ctx, last

    def prepare_decode(self, seqs: list[Sequence], blocks: BlockManager):
        width = max(len(s.block_table) for s in seqs)
        tables = [s.block_table + [0] * (width - len(s.block_table)) for s in seqs]
        ctx = ForwardContext(is_prefill=False,
                             slot_mapping=self._tensor([blocks.slot(s, s.num_tokens - 1) for s in seqs]),
                             state_slots=self._tensor([s.state_slot for s in seqs]),
                             block_tables=self._tensor(tables, torch.int32),
                             context_lens=self._tensor([s.num_tokens for s in seqs], torch.int32),
                             max_context_len=max(s.num_tokens for s in seqs))
        return self._tensor([s.last_token for s in seqs]), self._tensor([s.num_tokens - 1 for s in seqs]), ctx

    @torch.inference_mode()
    def run(self, batch: Batch, blocks: BlockManager) -> torch.Tensor:
        """Forward + sample; returns the next token of every sequence in the batch ([B], on device)."""
        if batch.is_prefill:
            ids, pos, ctx, last = self.prepare_prefill(batch.seqs, blocks)
            hidden = self.model(ids, pos, ctx)[last]
        else:
            ids, pos, ctx = self.prepare_decode(batch.seqs, blocks)
            hidden = self.model(ids, pos, ctx)
        logits = self.model.compute_logits(hidden)
        rows = [s.row for s in batch.seqs]
        r = self._tensor(rows)
        steps = self._tensor([len(s.output_ids) for s in batch.seqs])
        return sample(logits, self.temperature[r], self.top_k[r], self.top_p[r], self.seeds[r], steps,
                      any(self.uses_top_k[i] for i in rows), any(self.uses_top_p[i] for i in rows))
