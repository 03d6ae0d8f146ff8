"""What one forward pass of the AR engine needs besides token ids: where tokens sit in the caches.

The engine fills a ForwardContext per step; attention layers read and write the paged KV cache
through it, linear-attention layers their per-sequence recurrent state slots. For CUDA graphs the
engine keeps the tensors of a decode context as static buffers and refills them in place.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ForwardContext:
    is_prefill: bool
    slot_mapping: torch.Tensor            # [T] int64: cache slot (block * block_size + offset) per token
    state_slots: torch.Tensor             # [B] int64: recurrent-state slot per sequence
    # prefill: tokens of B sequences packed one after another
    seq_lens: list[int] | None = None     # host copy, prefill only
    cu_seqlens: torch.Tensor | None = None  # [B+1] int32 ([B+2] in a prefill graph: see prompts_cu)
    max_seqlen: int = 0                   # host bound on every packed length (varlen attention's grid)
    # decode: one token per sequence (and a prefill over cached prefixes: see prefix_lens)
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int32
    context_lens: torch.Tensor | None = None  # [B] int32, including the token being decoded (prefill: the prompt)
    max_context_len: int = 0              # host bound used by the torch reference path
    # prefill of prompts whose first tokens' K/V are already in the paged cache (prefix caching): per
    # sequence, how many (host); the packed tokens are each prompt's rest, at positions from there
    prefix_lens: list[int] | None = None
    # rotary positions, where they are not `positions` (a token's place in its sequence): [T] int64, or
    # [A, T] with one row per rotary axis (multimodal rope: time, height, width). Set only by an engine
    # that takes spliced prompt embeddings (ar/prompt_embeds.py); None everywhere else.
    rope_positions: torch.Tensor | None = None
    # what a model derives from the host fields once per forward and every layer reuses (e.g. the
    # delta rule's chunk layout, uploaded once rather than once per layer)
    memo: dict = field(default_factory=dict)

    def prompts_cu(self) -> torch.Tensor:
        """cu_seqlens of the prompts that own state slots, [len(state_slots) + 1]. A prefill graph packs
        its padding tokens after them as one more sequence, which attention sees and recurrent layers must not."""
        return self.cu_seqlens[:len(self.state_slots) + 1]


@dataclass(frozen=True)
class AttentionCacheSpec:
    """A full-attention layer needs paged K/V blocks."""
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class RecurrentStateSpec:
    """A linear-attention layer needs one state slot per running sequence."""
    conv_shape: tuple[int, ...]       # per sequence
    state_shape: tuple[int, ...]      # per sequence
