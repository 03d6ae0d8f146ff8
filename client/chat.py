"""Chat with a `<model>_chat` ensemble over gRPC streaming.

    client = ChatClient("localhost:8001")
    for chunk in client.stream("qwen3_chat", messages=[{"role": "user", "content": "Hi"}]):
        print(chunk.text, end="", flush=True)
"""
from __future__ import annotations

import queue
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import tritonclient.grpc as grpcclient

from client.tensors import make_inputs


@dataclass
class ChatChunk:
    text: str
    finish_reason: str | None          # set on the last chunk: "stop", "length"
    prompt_tokens: int
    completion_tokens: int


class ChatClient:
    def __init__(self, url: str = "localhost:8001", timeout_s: float = 300.0):
        self.url = url
        self.timeout_s = timeout_s

    def stream(self, model: str, messages: list[dict] | None = None, prompt: str | None = None,
               sampling: dict[str, Any] | None = None, stream: bool = True,
               chat_template_kwargs: dict | None = None) -> Iterator[ChatChunk]:
        """Yields text as it is generated. Closing the generator early cancels the request."""
        inputs = make_inputs(grpcclient, {
            "messages": (messages, "BYTES"), "text_input": (prompt, "BYTES"),
            "sampling_parameters": (sampling, "BYTES"), "stream": (stream, "BOOL"),
            "chat_template_kwargs": (chat_template_kwargs, "BYTES")})
        results: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(self.url)
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        finished = False
        try:
            client.async_stream_infer(model, inputs, request_id=uuid.uuid4().hex)
            while True:
                result, error = results.get(timeout=self.timeout_s)
                if error is not None:
                    raise error
                reason = result.as_numpy("finish_reason")[0, 0].decode()
                yield ChatChunk(result.as_numpy("text_output")[0, 0].decode("utf-8"), reason or None,
                                int(result.as_numpy("prompt_tokens")[0, 0]),
                                int(result.as_numpy("completion_tokens")[0, 0]))
                if reason:
                    finished = True
                    return
        finally:
            client.stop_stream(cancel_requests=not finished)
            client.close()

    def complete(self, model: str, **kwargs) -> ChatChunk:
        """The whole answer as one chunk (the server sends it in one response)."""
        chunks = list(self.stream(model, stream=False, **kwargs))
        last = chunks[-1]
        return ChatChunk("".join(c.text for c in chunks), last.finish_reason, last.prompt_tokens, last.completion_tokens)
