"""Qwen3-TTS generation without the engine: a plain batched loop over the talker and the code predictor
with its own small paged cache, what the engine step must do and what the parity tests run (the
served talker is `talker_engine` in model.py, driven by the talker_frames step in talker.py)."""
from __future__ import annotations

from typing import Callable

import torch

from triton_omni.models.context import ForwardContext
from triton_omni.tts.qwen3_tts.model import Qwen3TTS, Sampler, TalkerPrompt, TalkerRules, greedy


def bind_cache(model: Qwen3TTS, rows: int, max_len: int) -> None:
    """Binds a paged KV cache as the engine lays it out, one block of `max_len` slots per row (row r's
    position i is slot r * max_len + i), to the talker's attention layers (not the engine's way of
    sizing it: for `prefill` / `generate_codes` and tests)."""
    from triton_omni.ar.model_runner import cache_layers

    p = next(model.parameters())
    for module, spec in cache_layers(model):
        shape = (rows, max_len, spec.num_kv_heads, spec.head_dim)
        module.k_cache = torch.zeros(shape, dtype=p.dtype, device=p.device)
        module.v_cache = torch.zeros(shape, dtype=p.dtype, device=p.device)


@torch.no_grad()
def prefill(model: Qwen3TTS, prompts: list[TalkerPrompt], max_len: int) -> torch.Tensor:
    """The prompts packed into one talker forward, row r's keys/values into block r (a cache bound by
    `bind_cache`); returns the hidden states at every prompt token, packed [sum T, H]."""
    dev = next(model.parameters()).device
    lens = [p.embeds.shape[0] for p in prompts]
    slots = torch.cat([torch.arange(n, device=dev) + r * max_len for r, n in enumerate(lens)])
    positions = torch.cat([torch.arange(n, device=dev) for n in lens])
    ctx = ForwardContext(is_prefill=True, slot_mapping=slots, state_slots=torch.arange(len(prompts), device=dev),
                         seq_lens=lens, cu_seqlens=torch.tensor([0, *lens], device=dev).cumsum(0).int())
    return model(torch.cat([p.embeds for p in prompts]), positions, ctx)


@torch.no_grad()
def generate_codes(model: Qwen3TTS, prompts: list[TalkerPrompt], max_frames: int, repetition_penalty: float = 1.05,
                   sample_code0: Callable[[torch.Tensor, int], torch.Tensor] = greedy,
                   subtalker: Sampler = greedy, max_len: int | None = None) -> list[torch.Tensor]:
    """The reference's generation loop, batched; returns each prompt's frames [F, N] (EOS frame and
    after dropped). Per step: logits -> TalkerRules -> code 0 -> predict_codes -> frame -> embed_frame +
    text stream -> one talker decode step. `sample_code0(logits, step)` and `subtalker` pick codes."""
    dev = next(model.parameters()).device
    b = len(prompts)
    lens = [p.embeds.shape[0] for p in prompts]
    max_len = max_len or max(lens) + max_frames + 1
    bind_cache(model, b, max_len)
    rules = TalkerRules(model)
    hidden = prefill(model, prompts, max_len)[torch.tensor(lens, device=dev).cumsum(0) - 1]
    trailing = torch.nn.utils.rnn.pad_sequence([p.trailing for p in prompts], batch_first=True)
    text_lens = torch.tensor([p.trailing.shape[0] for p in prompts], device=dev)
    pad = torch.stack([p.pad for p in prompts])
    vocab = model.config.talker.vocab_size
    seen = torch.zeros(b, vocab, dtype=torch.bool, device=dev)
    pos = torch.tensor(lens, device=dev)
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    frames: list[torch.Tensor] = []
    for step in range(max_frames):
        steps = torch.full((b,), step, device=dev)
        logits = rules(model.compute_logits(hidden), seen, steps, repetition_penalty)
        code0 = sample_code0(logits, step)
        seen[torch.arange(b, device=dev), code0] = True
        done = done | (code0 == rules.eos)
        codes = model.predict_codes(hidden, code0, subtalker)
        frames.append(torch.where(done[:, None], -1, codes))
        if bool(done.all()) or step + 1 == max_frames:
            break
        x = model.embed_frame(codes, model.text_at(trailing, text_lens, steps, pad))
        ctx = ForwardContext(is_prefill=False, slot_mapping=torch.arange(b, device=dev) * max_len + pos,
                             state_slots=torch.arange(b, device=dev),
                             block_tables=torch.arange(b, device=dev, dtype=torch.int32)[:, None],
                             context_lens=(pos + 1).int(), max_context_len=int(pos.max()) + 1)
        hidden = model(x, pos, ctx)
        pos = pos + 1
    out = torch.stack(frames, dim=1)                                            # [B, F, N]
    return [row[row[:, 0] >= 0] for row in out]
