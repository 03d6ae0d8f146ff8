"""Chat with a chat model (route `chat`), streamed over gRPC (or HTTP: `http://host:8000`).

    client = ChatClient("localhost:8001")
    for chunk in client.stream("qwen3_chat", messages=[{"role": "user", "content": "Hi"}]):
        print(chunk.text, end="", flush=True)
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

from triton_omni.client.tensors import first, text
from triton_omni.client.triton import responses


@dataclass
class ChatChunk:
    text: str
    finish_reason: str | None          # set on the last chunk: "stop", "length"
    prompt_tokens: int
    completion_tokens: int


def _finished(outputs) -> bool:
    return bool(text(outputs, "finish_reason"))


class ChatClient:
    def __init__(self, url: str = "localhost:8001", timeout_s: float = 300.0):
        self.url = url
        self.timeout_s = timeout_s

    def stream(self, model: str, messages: list[dict] | None = None, prompt: str | None = None,
               sampling: dict[str, Any] | None = None, stream: bool = True,
               chat_template_kwargs: dict | None = None, images: list[bytes] | None = None,
               videos: list[bytes] | None = None, mm_processor_kwargs: dict | None = None,
               audios: list[bytes] | None = None) -> Iterator[ChatChunk]:
        """Yields text as it is generated. Closing the generator early cancels the request. `images` /
        `videos` (a vision model), `audios` (an omni model): encoded files, taken in order by {"type":
        "image"} / {"type": "video"} / {"type": "audio"} content parts of the messages;
        `mm_processor_kwargs`: e.g. {"fps": 2} for the videos."""
        values = {"messages": (messages, "BYTES"), "text_input": (prompt, "BYTES"),
                  "sampling_parameters": (sampling, "BYTES"), "stream": (stream, "BOOL"),
                  "chat_template_kwargs": (chat_template_kwargs, "BYTES"), "images": (images or None, "BYTES"),
                  "videos": (videos or None, "BYTES"), "mm_processor_kwargs": (mm_processor_kwargs, "BYTES"),
                  "audios": (audios or None, "BYTES")}
        with contextlib.closing(responses(self.url, model, values, self.timeout_s, last=_finished)) as replies:
            for outputs in replies:
                reason = text(outputs, "finish_reason")
                yield ChatChunk(text(outputs, "text_output"), reason or None,
                                int(first(outputs, "prompt_tokens", 0)), int(first(outputs, "completion_tokens", 0)))
                if reason:
                    return

    def complete(self, model: str, **kwargs) -> ChatChunk:
        """The whole answer as one chunk (the server sends it in one response)."""
        chunks = list(self.stream(model, stream=False, **kwargs))
        last = chunks[-1]
        return ChatChunk("".join(c.text for c in chunks), last.finish_reason, last.prompt_tokens, last.completion_tokens)
