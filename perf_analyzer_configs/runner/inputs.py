"""perf_analyzer input-data JSON for each OpenAI route's tensor contract (ensemble_configs/README.md).

Text goes in as strings; binary inputs (audio, images) as `{"b64": ..., "shape": [...]}`, whose
bytes are the tensor's raw content: for BYTES tensors Triton's serialization (a 4-byte
little-endian length before each element). Each file holds a few requests that perf_analyzer
cycles through.
"""
from __future__ import annotations

import base64
import io
import json
import math
import struct
import wave
from pathlib import Path
from typing import Any

PROMPTS = ["Write a haiku about the sea.", "Tell me a story about a robot who learns to paint.",
           "Explain dynamic batching in two sentences.", "List three uses of a paperclip."]
SPEECH_TEXTS = ["Hello there, this is a short test of streaming speech.",
                "The quick brown fox jumps over the lazy dog."]
IMAGE_PROMPTS = ["a red fox in the snow, photograph", "a watercolor lighthouse at dusk"]

# The contract's text and number inputs per route, and their types, for `--input NAME=VALUE`.
_IMAGE = {"prompt", "negative_prompt", "size", "num_inference_steps", "guidance_scale", "seed", "n", "output_format"}
ROUTE_INPUTS = {
    "chat": {"messages", "text_input", "sampling_parameters", "stream", "chat_template_kwargs"},
    "speech": {"text", "voice", "response_format", "stream", "speed", "sampling_parameters", "reference_text"},
    "transcription": {"language"},
    "image_generation": _IMAGE,
    "image_edit": _IMAGE,
    "video": (_IMAGE - {"n", "output_format"}) | {"seconds", "num_frames", "fps", "guidance_scale_2"},
}
DTYPES = {"messages": "BYTES", "text_input": "BYTES", "sampling_parameters": "BYTES", "stream": "BOOL",
          "chat_template_kwargs": "BYTES", "text": "BYTES", "voice": "BYTES", "response_format": "BYTES",
          "speed": "FP32", "reference_text": "BYTES", "language": "BYTES", "prompt": "BYTES",
          "negative_prompt": "BYTES", "size": "BYTES", "num_inference_steps": "INT32", "guidance_scale": "FP32",
          "seed": "INT64", "n": "INT32", "output_format": "BYTES", "seconds": "FP32", "num_frames": "INT32",
          "fps": "INT32", "guidance_scale_2": "FP32"}


def serialized(items: list[bytes]) -> dict:
    """Binary BYTES elements as perf_analyzer's b64 raw content."""
    raw = b"".join(struct.pack("<I", len(b)) + b for b in items)
    return {"b64": base64.b64encode(raw).decode(), "shape": [len(items)]}


def tone_wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A 440 Hz tone: something to transcribe without shipping a recording."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate)))
                               for i in range(int(seconds * rate))))
    return buf.getvalue()


def small_png(size: int = 64) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), (200, 80, 40)).save(buf, format="PNG")
    return buf.getvalue()


def requests_for(route: str, max_tokens: int = 128) -> list[dict[str, Any]]:
    if route == "chat":
        sampling = json.dumps({"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
        return [{"messages": [json.dumps([{"role": "user", "content": p}])], "sampling_parameters": [sampling],
                 "stream": [True]} for p in PROMPTS]
    if route == "speech":
        return [{"text": [t], "response_format": ["pcm"], "stream": [True]} for t in SPEECH_TEXTS]
    if route == "transcription":
        return [{"audio": serialized([tone_wav()])}]
    if route == "image_generation":
        return [{"prompt": [p], "n": [1], "output_format": ["png"]} for p in IMAGE_PROMPTS]
    if route == "image_edit":
        return [{"prompt": [p], "n": [1], "output_format": ["png"], "image": serialized([small_png()])}
                for p in IMAGE_PROMPTS]
    if route == "video":
        return [{"prompt": [p]} for p in IMAGE_PROMPTS]
    raise ValueError(f"no perf_analyzer inputs for route {route!r}")


def override(requests: list[dict], route: str, name: str, value: str) -> list[dict]:
    """`--input size=512x512`: set one input in every request of a route that has it, typed by the contract."""
    dtype = DTYPES.get(name)
    if dtype is None:
        raise ValueError(f"unknown input {name!r}; known: {', '.join(sorted(DTYPES))}")
    if name not in ROUTE_INPUTS[route]:
        return requests
    typed: Any = {"BOOL": lambda v: v.lower() == "true", "FP32": float, "INT32": int, "INT64": int}.get(dtype, str)(value)
    return [{**r, name: [typed]} for r in requests]


def input_data(route: str, max_tokens: int = 128, overrides: list[str] = ()) -> dict:
    requests = requests_for(route, max_tokens)
    for item in overrides:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--input expects NAME=VALUE, got {item!r}")
        requests = override(requests, route, name, value)
    return {"data": requests}


def write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
