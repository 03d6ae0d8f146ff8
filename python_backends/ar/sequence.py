"""One request's state inside the engine."""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

from triton_omni.ar.sampling import SamplingParams

_ids = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams                  # resolved: max_tokens and seed are set
    on_output: Callable[["Sequence", list[int], str | None], None] | None = None
    seq_id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: str | None = None         # "stop", "length", "abort"
    block_table: list[int] = field(default_factory=list)
    state_slot: int = -1                     # recurrent-state slot (hybrid models), -1 = none
    row: int = -1                            # this sequence's row in the engine's per-slot tables
    num_launched: int = 0                    # tokens whose sampling has been launched (ahead of output_ids)
    # a frame model's own prompt (e.g. a TTS talker's embeddings) instead of prompt_ids: anything with a
    # len() (its number of positions), handed to the model's `admit_row` / `prefill_embeds` as is
    prompt: Any = None
    # rows spliced over placeholder tokens of prompt_ids at prefill, and the prompt's rotary positions
    # (ar/prompt_embeds.PromptEmbeds); dropped once the prefill is launched
    embeds: Any = None
    arrival: float = 0.0                     # wall-clock time of engine.add (for the engine's trace)
    scheduled: float = 0.0                   # wall-clock time its prefill was scheduled (queue-time metric)
    # n > 1: the samples after the first are forks of it, prefilled with it once (ar/forks.py)
    index: int = 0                           # which of the request's samples this is
    parent: "Sequence | None" = None
    forks: list["Sequence"] = field(default_factory=list)
    num_cached: int = 0                      # prompt tokens found in the prefix cache (not prefilled)
    block_hashes: list[bytes] | None = None  # of the prompt's full blocks (ar/prefix_cache.py)
    cache_salt: bytes = b""                  # anything besides token ids that shapes the prompt's KV
    matcher: Any = None                      # structured output's grammar matcher (ar/grammar.py), or None
    thinking: bool = False                   # starts inside its reasoning (the prompt opened it)
    thinking_left: int = -1                  # reasoning tokens still allowed; -1: no budget
    new_logprobs: list | None = None         # the last reported token's (logprob, [(id, logprob)...]), if asked

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids) if self.prompt is None else len(self.prompt)

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + len(self.output_ids)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def max_total_tokens(self) -> int:
        return self.prompt_len + self.params.max_tokens
