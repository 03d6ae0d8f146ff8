"""What a request asks of its logits besides temperature / top-k / top-p, applied on the device.

Every parameter lives in a per-row device buffer (like the engine's other per-sequence state), so a
decode step over rows with different settings is one set of tensor ops over the batch, captured in
its CUDA graph; a row that asks for nothing gets neutral values (penalty 1, bias 0, every token
allowed). Which of these ops a step runs at all (`Features`) is known on the host when it is
scheduled, and is part of the step's graph key: a batch without penalties never pays for them.

In order, on the model's logits [B, V]:
    penalties   repetition (transformers' / vLLM's: logits of prompt and generated tokens divided by
                p where positive, multiplied where negative), then frequency and presence (OpenAI's:
                minus count x frequency, minus presence where count > 0) over generated tokens
    bias        logit_bias: up to MAX_BIAS (token, value) pairs per row added
    mask        a grammar's token bitmask (structured output, ar/grammar.py): disallowed tokens -inf.
                The host fills a row's words before each of its steps; the graph reads the buffer.
then the sampler (temperature, min-p, top-k, top-p; ar/sampling.py), then
    budget      reasoning budget: once a row has thought `thinking_budget` tokens, its next token is
                the end-of-reasoning token
    logprobs    log-softmax of the model's own logits (before any of the above, as OpenAI and vLLM
                report them): the chosen token's, and the top MAX_TOP ids and values
and the generated-token counts that the penalties read are advanced.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from triton_omni.ar.sampling import SamplingParams

MAX_BIAS = SamplingParams.MAX_LOGIT_BIAS
MAX_TOP = SamplingParams.MAX_TOP_LOGPROBS


@dataclass(frozen=True)
class Features:
    """Which optional ops a step runs (any of its rows needs them)."""
    penalties: bool = False
    bias: bool = False
    mask: bool = False
    min_p: bool = False
    budget: bool = False
    logprobs: bool = False

    @classmethod
    def of(cls, seqs) -> "Features":
        ps = [s.params for s in seqs]
        return cls(penalties=any(p.needs_penalties for p in ps), bias=any(bool(p.logit_bias) for p in ps),
                   mask=any(s.matcher is not None for s in seqs), min_p=any(p.min_p > 0 for p in ps),
                   budget=any(s.thinking_left >= 0 for s in seqs), logprobs=any(p.logprobs is not None for p in ps))


class RowLogits:
    """The per-row buffers and the ops of the module docstring."""

    def __init__(self, rows: int, vocab: int, max_batch: int, device: torch.device,
                 think_ids: tuple[int, int] | None = None):
        self.vocab, self.device = vocab, device
        z = lambda *shape, dt=torch.float32: torch.zeros(shape, dtype=dt, device=device)  # noqa: E731
        self.presence, self.frequency, self.min_p = z(rows), z(rows), z(rows)
        self.repetition = torch.ones(rows, device=device)
        self.counts = z(rows, vocab, dt=torch.int32)            # generated tokens, per row
        self.in_prompt = z(rows, vocab, dt=torch.bool)          # prompt tokens (repetition penalty)
        self.bias_ids, self.bias_values = z(rows, MAX_BIAS, dt=torch.int64), z(rows, MAX_BIAS)
        self.words = -(-vocab // 32)
        self.bitmask = torch.full((rows, self.words), -1, dtype=torch.int32, device=device)
        idx = torch.arange(vocab, device=device)
        self.word_of, self.bit_of = idx // 32, (idx % 32).to(torch.int32)
        # reasoning: tokens still allowed (-1: no budget), whether the row is inside its reasoning
        self.think_left = torch.full((rows,), -1, dtype=torch.int64, device=device)
        self.thinking = z(rows, dt=torch.bool)
        self.think_start, self.think_end = think_ids if think_ids is not None else (-1, -1)
        # a step's logprobs: [chosen, top MAX_TOP] values and the top ids, per batch row
        self.logprob_values = z(max_batch, 1 + MAX_TOP)
        self.logprob_ids = z(max_batch, MAX_TOP, dt=torch.int64)

    # -- admission (host -> device, once per sequence) ------------------------------------------------
    def admit(self, seqs, rows: torch.Tensor, upload) -> None:
        floats, bias_ids, bias_values = [], [], []
        for s in seqs:
            p = s.params
            floats.append([p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.min_p])
            items = sorted((int(k), v) for k, v in (p.logit_bias or {}).items())
            bias_ids.append([k for k, _ in items] + [0] * (MAX_BIAS - len(items)))
            bias_values.append([v for _, v in items] + [0.0] * (MAX_BIAS - len(items)))
        floats = upload(floats, torch.float32)
        for i, buf in enumerate((self.presence, self.frequency, self.repetition, self.min_p)):
            buf[rows] = floats[:, i]
        if any(s.params.logit_bias for s in seqs):
            self.bias_ids[rows] = upload(bias_ids)
            self.bias_values[rows] = upload(bias_values, torch.float32)
        else:
            self.bias_values[rows] = 0.0
        self.bitmask[rows] = -1
        self.think_left[rows] = upload([s.thinking_left for s in seqs])
        self.thinking[rows] = upload([s.thinking for s in seqs], torch.bool)
        penalized = [i for i, s in enumerate(seqs) if s.params.needs_penalties]
        if penalized:
            prow = rows[upload(penalized)]
            self.counts[prow] = 0
            self.in_prompt[prow] = False
            for i in penalized:            # the host's row numbers: reading `rows` would wait for the device
                if seqs[i].params.repetition_penalty != 1.0 and seqs[i].prompt_ids:
                    self.in_prompt[seqs[i].row][upload(sorted(set(seqs[i].prompt_ids)))] = True

    def copy_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """A fork (n > 1) starts from its parent's state: generated counts (none yet), prompt tokens."""
        self.counts[dst] = self.counts[src]
        self.in_prompt[dst] = self.in_prompt[src]

    # -- in the step (graph-captured) --------------------------------------------------------------------
    def sample(self, logits: torch.Tensor, rows: torch.Tensor, f: Features,
               pick: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Process the logits [B, V], pick tokens [B] with the step's sampler, then the budget,
        logprobs and counts. Writes the logprob buffers' first B rows when `f.logprobs`."""
        raw = logits
        x = logits.float()
        if f.penalties:
            counts = self.counts[rows]
            rep = self.repetition[rows][:, None]
            seen = (counts > 0) | self.in_prompt[rows]
            x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
            x = x - self.frequency[rows][:, None] * counts - self.presence[rows][:, None] * (counts > 0)
        if f.bias:
            x = x.scatter_add(1, self.bias_ids[rows], self.bias_values[rows])
        if f.mask:
            allowed = (self.bitmask[rows][:, self.word_of] >> self.bit_of) & 1
            x = x.masked_fill(allowed == 0, float("-inf"))
        tokens = pick(x)
        if f.budget:
            thinking, left = self.thinking[rows], self.think_left[rows]
            tokens = torch.where(thinking & (left == 0), self.think_end, tokens)
            self.think_left[rows] = torch.where(thinking & (left > 0), left - 1, left)
            self.thinking[rows] = (thinking & (tokens != self.think_end)) | (tokens == self.think_start)
        if f.logprobs:
            lp = raw.float().log_softmax(-1)
            top = lp.topk(min(MAX_TOP, lp.shape[-1]), dim=-1)
            B = tokens.shape[0]
            self.logprob_values[:B, 0] = lp.gather(1, tokens[:, None])[:, 0]
            self.logprob_values[:B, 1:1 + top.values.shape[1]] = top.values
            self.logprob_ids[:B, :top.indices.shape[1]] = top.indices
        if f.penalties:
            self.counts.index_put_((rows, tokens), torch.ones_like(tokens, dtype=torch.int32), accumulate=True)
        return tokens


def reference_process(logits: torch.Tensor, prompt: list[int], generated: list[int], p: SamplingParams,
                      allowed: torch.Tensor | None = None) -> torch.Tensor:
    """One row's processed logits [V] written out plainly: what RowLogits.sample computes before picking
    (tests hold the batched ops against it, and it against transformers' logits processors)."""
    x = logits.float().clone()
    seen = set(prompt) | set(generated) if p.repetition_penalty != 1 else set(generated)
    for t in seen:
        if p.repetition_penalty != 1 and (t in prompt or t in generated):
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(generated):
        x[t] -= p.frequency_penalty * generated.count(t) + p.presence_penalty
    for k, v in (p.logit_bias or {}).items():
        x[int(k)] += v
    if allowed is not None:
        x[~allowed] = float("-inf")
    return x
