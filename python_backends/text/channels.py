"""Which part of a chat answer each generated token belongs to: its content, its reasoning, a tool call.

Qwen3 / Qwen3.5 write reasoning between `<think>` and `</think>` (Qwen3.5's template opens it in the
prompt, so the answer starts inside it) and tool calls as `<tool_call>\\n{"name": ..., "arguments":
...}\\n</tool_call>`; each marker is one token of the vocabulary. The AR step tags every released
token with its channel (markers are tagged MARKER: the detokenizer drops them) and holds a tool
call's tokens until its closing marker, so the stateless detokenizer gets each call whole and can
parse it. Plain `text_input` requests (Triton's vLLM backend, /v1/completions) are not split.
"""
from __future__ import annotations

from dataclasses import dataclass

CONTENT, REASONING, TOOL, MARKER = 0, 1, 2, 3
MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>")


@dataclass(frozen=True)
class MarkerIds:
    think: int = -1
    think_end: int = -1
    tool: int = -1
    tool_end: int = -1

    @classmethod
    def of(cls, tokenizer) -> "MarkerIds":
        """The markers' ids, where the vocabulary has each as one token (-1 where not)."""
        vocab = tokenizer.get_vocab()
        return cls(*(vocab.get(m, -1) for m in MARKERS))

    @property
    def reasoning(self) -> tuple[int, int] | None:
        return (self.think, self.think_end) if self.think >= 0 and self.think_end >= 0 else None


def opens_reasoning(prompt_ids, ids: MarkerIds) -> bool:
    """Whether the prompt ends inside reasoning (its last think marker opens one)."""
    for t in reversed(prompt_ids):
        if t == ids.think_end:
            return False
        if t == ids.think:
            return True
    return False


class ChannelSplitter:
    """One answer's channel state: tokens in, (token, channel) pairs out, tool calls whole."""

    def __init__(self, ids: MarkerIds, reasoning: bool, tools: bool, in_reasoning: bool = False):
        self.ids, self.reasoning, self.tools = ids, reasoning, tools
        self.channel = REASONING if (reasoning and in_reasoning) else CONTENT
        self.held: list[int] = []          # a tool call's tokens, from its opening marker
        self.reasoning_tokens = 0

    def push(self, tokens: list[int]) -> list[tuple[int, int]]:
        out = []
        for t in tokens:
            if self.held:
                self.held.append(t)
                if t == self.ids.tool_end:
                    out += [(x, MARKER if i in (0, len(self.held) - 1) else TOOL) for i, x in enumerate(self.held)]
                    self.held = []
            elif self.tools and t == self.ids.tool and self.channel == CONTENT:
                self.held = [t]
            elif self.reasoning and t == self.ids.think:
                self.channel = REASONING
                out.append((t, MARKER))
            elif self.reasoning and t == self.ids.think_end:
                self.channel = CONTENT
                out.append((t, MARKER))
            else:
                self.reasoning_tokens += self.channel == REASONING
                out.append((t, self.channel))
        return out

    def flush(self) -> list[tuple[int, int]]:
        """At the end: an unclosed tool call is content (its marker's text included)."""
        out, self.held = [(t, CONTENT) for t in self.held], []
        return out
