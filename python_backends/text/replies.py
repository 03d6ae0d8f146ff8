"""How a chat model's answer is to be returned, decided by its pre step (the `reply_options` tensor).

    reasoning   split the answer's reasoning from its content (chat requests; not raw `text_input`)
    tools       parse tool calls out of the answer (the request offered tools and did not say "none")
    echo        put the prompt's text before the answer (Triton's vLLM backend without
                `exclude_input_in_output`, not streaming; /v1/completions' `echo`)
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from triton_omni.runtime.errors import InvalidInput


@dataclass(frozen=True)
class ReplyOptions:
    reasoning: bool = False
    tools: bool = False
    echo: bool = False

    @classmethod
    def from_json(cls, raw: Any) -> "ReplyOptions":
        if raw is None:
            return cls()
        if not isinstance(raw, dict) or set(raw) - {f.name for f in dataclasses.fields(cls)} \
                or not all(isinstance(v, bool) for v in raw.values()):
            raise InvalidInput("reply_options", "expected an object of booleans: reasoning, tools, echo")
        return cls(**raw)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))
