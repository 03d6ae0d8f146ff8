"""The realtime API's models in a cascade: speech to text -> chat -> text to speech, over Triton streams.

A response streams the chat model's text as it comes (`response.text.delta`, or with audio
`response.audio_transcript.delta`) and cuts it into sentences; each sentence goes to the speech model
as soon as it is complete, while the chat model goes on writing, so the first audio
(`response.audio.delta`) comes before the whole answer is written. The speech model's PCM is
resampled to the session's output rate (PyAV's resampler: FFmpeg's). Cancelling the response (its
task) closes every Triton stream it has open with cancel_requests=True (triton.py), so the models stop.
"""
from __future__ import annotations

import asyncio
import base64
import re
from contextlib import aclosing
from typing import Awaitable, Callable

import numpy as np

from triton_omni.client.openai_proxy.audio import speech_param
from triton_omni.client.openai_proxy.chat_fields import param_mapper
from triton_omni.client.openai_proxy.transcriptions import model_field
from triton_omni.client.tensors import first, text
from triton_omni.client.transcribe import Transcription, request_values

Send = Callable[[dict], Awaitable[None]]
MAX_SENTENCE_CHARS = 400        # a sentence without an end is cut (at a space) past this
_END = re.compile(r"[.!?;:\u3002\uff01\uff1f\u2026]+[\"')\]]*\s+|\n+")


class Sentences:
    """Cuts streamed text into sentences: at an end mark followed by white space, or a line break
    (so "3.14" is not cut), or at a space once MAX_SENTENCE_CHARS have come without one."""

    def __init__(self):
        self.pending = ""

    def feed(self, piece: str) -> list[str]:
        self.pending += piece
        out = []
        while True:
            m = _END.search(self.pending)
            if m is None:
                break
            out.append(self.pending[:m.end()])
            self.pending = self.pending[m.end():]
        while len(self.pending) > MAX_SENTENCE_CHARS:
            cut = self.pending.rfind(" ", 0, MAX_SENTENCE_CHARS)
            cut = cut + 1 if cut > 0 else MAX_SENTENCE_CHARS
            out.append(self.pending[:cut])
            self.pending = self.pending[cut:]
        return [s for s in out if s.strip()]

    def flush(self) -> list[str]:
        rest, self.pending = self.pending, ""
        return [rest] if rest.strip() else []


class Resampler:
    """PCM16 mono from the speech model's rate to the session's (FFmpeg's resampler, which keeps its
    state across the chunks of one stream)."""

    def __init__(self, out_rate: int):
        self.out_rate = out_rate
        self.resampler, self.in_rate = None, None

    def convert(self, pcm: bytes, rate: int) -> bytes:
        if rate == self.out_rate or not pcm:
            return pcm
        import av

        if self.resampler is None or rate != self.in_rate:
            self.resampler, self.in_rate = av.AudioResampler(format="s16", layout="mono", rate=self.out_rate), rate
        frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm, dtype="<i2")[None], format="s16", layout="mono")
        frame.sample_rate = rate
        return b"".join(f.to_ndarray().tobytes() for f in self.resampler.resample(frame))

    def flush(self) -> bytes:
        if self.resampler is None:
            return b""
        out = b"".join(f.to_ndarray().tobytes() for f in self.resampler.resample(None))
        self.resampler = None
        return out


async def transcribe(gateway, model: str, wav: bytes, language: str | None) -> Transcription:
    """The transcript of one committed audio item."""
    replies = gateway.stream(model, request_values(wav, language=language), param_of=model_field)
    async with aclosing(replies):
        return Transcription.from_responses([o async for o in replies])


class Answer:
    """One response's text, usage and audio, as the cascade makes them."""

    def __init__(self):
        self.pieces: list[str] = []
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
        self.finish_reason = ""
        self.audio_bytes = 0

    @property
    def text(self) -> str:
        return "".join(self.pieces)


async def chat_text(gateway, model, messages: list[dict], sampling: dict, answer: Answer, on_piece) -> None:
    """Stream the chat model's answer; `on_piece(text)` gets each piece."""
    values = {"messages": (messages, "BYTES"), "sampling_parameters": (sampling or None, "BYTES"),
              "stream": (True, "BOOL")}
    replies = gateway.stream(model.name, values, param_of=param_mapper({"max_tokens": "max_output_tokens"}),
                             batched=model.batched)
    async with aclosing(replies):
        async for outputs in replies:
            piece = text(outputs, "text_output")
            for key in answer.usage:
                answer.usage[key] = int(first(outputs, key, answer.usage[key]))
            answer.finish_reason = text(outputs, "finish_reason", answer.finish_reason) or answer.finish_reason
            if piece:
                answer.pieces.append(piece)
                await on_piece(piece)


async def speak(gateway, model: str, voice: str | None, sentence: str, resampler: Resampler, on_audio) -> None:
    """One sentence through the speech model, its PCM (at the session's rate) to `on_audio` as it comes."""
    values = {"text": (sentence, "BYTES"), "response_format": ("pcm", "BYTES"), "stream": (True, "BOOL"),
              "voice": (voice, "BYTES")}
    replies = gateway.stream(model, values, param_of=speech_param)
    async with aclosing(replies):
        async for outputs in replies:
            pcm = resampler.convert(first(outputs, "audio", b""), int(first(outputs, "sample_rate", 0)))
            if pcm:
                await on_audio(pcm)
    tail = resampler.flush()
    if tail:
        await on_audio(tail)


async def run_cascade(gateway, chat_model, speech_model: str | None, voice: str | None, out_rate: int,
                      messages: list[dict], sampling: dict, answer: Answer, send_text, send_audio) -> None:
    """The chat model's answer as text events and, with a speech model, its sentences spoken as they
    are written. The two run side by side; the first to fail cancels the other."""
    if speech_model is None:
        await chat_text(gateway, chat_model, messages, sampling, answer, send_text)
        return
    sentences: asyncio.Queue = asyncio.Queue()
    splitter = Sentences()
    resampler = Resampler(out_rate)

    async def write():
        async def on_piece(piece: str):
            await send_text(piece)
            for s in splitter.feed(piece):
                sentences.put_nowait(s)
        await chat_text(gateway, chat_model, messages, sampling, answer, on_piece)
        for s in splitter.flush():
            sentences.put_nowait(s)
        sentences.put_nowait(None)

    async def on_audio(pcm: bytes):
        answer.audio_bytes += len(pcm)
        await send_audio(base64.b64encode(pcm).decode())

    async def say():
        while (sentence := await sentences.get()) is not None:
            await speak(gateway, speech_model, voice, sentence, resampler, on_audio)

    tasks = [asyncio.create_task(write()), asyncio.create_task(say())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            if t.exception() is not None:
                raise t.exception()
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
