"""Prompts with spliced embeddings: token ids whose placeholder tokens are replaced, at prefill, by rows
computed elsewhere (an image's or a video's visual embeddings from a vision tower step, an audio
encoder's outputs), with each prompt token's own rotary position per axis where the model's rotary
has several axes (Qwen's multimodal rope: time, height, width).

Where they travel. An earlier ensemble step computes the rows (a GPU tensor between steps); the AR
step (ar/embeds_step.py) reads them with the token ids and hands the engine a `PromptEmbeds` with the
request: `engine.add(ids, params, on_output, embeds=PromptEmbeds(rows, index, rope_positions))`. The
engine must be built with `prompt_embeds=True` (LLMEngine(..., prompt_embeds=True)); a text-only
engine is exactly what it was (no extra buffer, kernel or upload).

How they run (model_runner.py):
- Prefill: the prompts' ids are embedded (`model.embed`) and the rows copied over their placeholder
  positions (one index_copy for every prompt of the step), then the model runs on the embeddings:
  through the same packed prefill, and the same CUDA graphs, as a frame model's prompt (the graph
  reads the static `prefill_embeds` buffer; embedding and splicing run just before its replay).
- Rotary: the packed rotary positions [A, T] (a prompt without its own: every axis its token index)
  go to the model in ForwardContext.rope_positions; the model's rotary (models/layers.py
  MRotaryEmbedding) gathers each token's cos/sin from them. In a graph they sit in the static
  prefill inputs beside the ids and positions.
- Decode: text after the prompt has one position on every axis: cache position + rope_delta
  (`PromptEmbeds.rope_delta`, kept per row on the device at admission; n > 1 forks take their
  parent's), added on the device inside the decode step (graph-captured; no host sync).
- Prefix caching: a prompt with spliced rows gets a cache salt of its own (`cache_salt`), so its
  blocks are never matched by another prompt whose placeholders hold other rows. (A digest of the
  media, made where the pixels are, would let identical images share; not done.) Qwen3.5's recurrent
  layers turn prefix caching off anyway.

Rules checked at `engine.add` (InvalidInput naming the field): one row per placeholder, rows as wide
as the model's hidden size, rotary positions [A, L] with A the model's axes, and 0 <= position < L:
a rotary position never runs ahead of the token's place, so decode positions stay inside the rotary
table and rope_delta <= 0.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch

from triton_omni.runtime.errors import InvalidInput


@dataclass
class PromptEmbeds:
    embeds: torch.Tensor                        # [N, H] rows in prompt order (any float dtype and device)
    index: np.ndarray                           # [N] int64: the prompt positions they replace, ascending
    rope_positions: np.ndarray | None = None    # [A, L] int64 per rotary axis; None: token i at i on every axis

    @property
    def rope_delta(self) -> int:
        """Decode step k (0, 1, ...) after a prompt of L tokens is at rotary position L + k + rope_delta:
        the text after the prompt continues from its largest rotary position + 1."""
        if self.rope_positions is None or self.rope_positions.size == 0:
            return 0
        return int(self.rope_positions.max()) + 1 - self.rope_positions.shape[1]

    def check(self, prompt_len: int, hidden: int, axes: int) -> None:
        n = self.index.shape[0]
        if self.embeds.dim() != 2 or self.embeds.shape[1] != hidden:
            raise InvalidInput("prompt_embeds", f"shape {list(self.embeds.shape)}; expected [rows, {hidden}]")
        if self.embeds.shape[0] != n:
            raise InvalidInput("prompt_embeds", f"{self.embeds.shape[0]} rows for {n} placeholder tokens in the prompt")
        if not self.embeds.is_floating_point():
            raise InvalidInput("prompt_embeds", f"expected floating point rows, got {self.embeds.dtype}")
        if n and (self.index[0] < 0 or self.index[-1] >= prompt_len or (np.diff(self.index) <= 0).any()):
            raise InvalidInput("prompt_embeds", "placeholder positions must be ascending prompt positions")
        rope = self.rope_positions
        if rope is not None:
            if rope.shape != (axes, prompt_len):
                raise InvalidInput("rope_positions", f"shape {list(rope.shape)}; expected [{axes}, {prompt_len}] "
                                                     "(rotary axes, prompt tokens)")
            if rope.size and (rope.min() < 0 or rope.max() >= prompt_len):
                raise InvalidInput("rope_positions", f"positions must be in [0, {prompt_len}) (the prompt's length)")


def rope_delta_of(seq) -> int:
    """A sequence's decode rope delta (a fork's is its parent's: it shares the parent's prompt)."""
    embeds = (seq.parent if seq.parent is not None else seq).embeds
    return embeds.rope_delta if embeds is not None else 0


def cache_salt(embeds: PromptEmbeds) -> bytes:
    """The prefix-cache salt of a prompt with these rows: unique when it has any (rows are not hashed)."""
    return os.urandom(16) if embeds.index.size else b""


def placeholder_index(ids: np.ndarray, placeholder_ids: Iterable[int]) -> np.ndarray:
    """Where a prompt's placeholder tokens are (the positions its spliced rows take)."""
    return np.flatnonzero(np.isin(ids, np.asarray(list(placeholder_ids), dtype=np.int64))).astype(np.int64)


def packed_rope_positions(seqs, positions: torch.Tensor, cu: torch.Tensor, axes: int) -> torch.Tensor:
    """[axes, T] host int64: the packed prompts' rotary positions, each prompt's own where it has them,
    else its tokens' positions (`positions` [T]: each token's place in its prompt) on every axis. A
    prompt's first `num_cached` tokens (in the prefix cache) are not packed."""
    rope = positions.expand(axes, -1).clone()
    for i, seq in enumerate(seqs):
        own = seq.embeds.rope_positions if seq.embeds is not None else None
        if own is not None:
            rope[:, int(cu[i]):int(cu[i + 1])] = torch.from_numpy(np.asarray(own[:, seq.num_cached:], dtype=np.int64))
    return rope


def packed_splice(seqs, cu: torch.Tensor) -> tuple[np.ndarray, list[torch.Tensor]]:
    """Where the packed prompts' spliced rows go (packed positions [N]), and the rows, in that order."""
    index, rows = [], []
    for i, seq in enumerate(seqs):
        e = seq.embeds
        if e is not None and e.index.size:
            keep = e.index >= seq.num_cached              # (never false: such prompts are salted)
            index.append(e.index[keep] - seq.num_cached + int(cu[i]))
            rows.append(e.embeds[torch.from_numpy(keep)] if not keep.all() else e.embeds)
    return (np.concatenate(index) if index else np.zeros(0, np.int64)), rows


def attach(seq, embeds: PromptEmbeds, runner) -> None:
    """A request's embeddings checked against its prompt and the engine's model, then kept on its sequence."""
    if not runner.spliced:
        raise InvalidInput("prompt_embeds", "this model takes no prompt embeddings")
    embeds.check(seq.prompt_len, runner.hidden_size, runner.rope_axes)
    seq.embeds, seq.cache_salt = embeds, cache_salt(embeds)


def embed_prompts(model, ids: torch.Tensor, seqs, cu: torch.Tensor, upload, out: torch.Tensor | None = None):
    """The packed prompts' input embeddings [T, H] (into `out[:T]`, a prefill graph's static buffer, if
    given): their tokens embedded, then each prompt's rows copied over its placeholders."""
    x = model.embed(ids)
    if out is not None:
        x = out[:x.shape[0]].copy_(x)
    return splice(x, *packed_splice(seqs, cu), upload)


def splice(x: torch.Tensor, index: np.ndarray, rows: list[torch.Tensor], upload) -> torch.Tensor:
    """x [T, H] (the prompts' token embeddings) with the rows copied over their positions, in place."""
    if rows:
        x.index_copy_(0, upload(index), torch.cat([r.to(x.device, x.dtype) for r in rows]))
    return x
