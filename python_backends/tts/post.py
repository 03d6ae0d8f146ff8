"""The speech post step: waveform -> what the client gets (the OpenAI `speech` route's outputs).

Streaming: each response's audio is a raw PCM chunk (s16le, mono, `sample_rate`). Otherwise the one
response carries the whole file in `response_format`. Stateless, so it batches freely; one
instance keeps a stream's chunks in order (as the chat detokenizer).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from triton_omni.media import audio
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, register
from triton_omni.tts.checks import MAX_AUDIO_SECONDS, max_samples, waveform
from triton_omni.tts.request import SPEECH, Speech


@dataclass
class SpeechPostParams:
    max_seconds: float = MAX_AUDIO_SECONDS     # the longest waveform taken (at its sample rate)


@register("speech_post")
class SpeechPost(Step):
    inputs = (
        TensorSpec("waveform", "TYPE_FP32", (-1,), ragged=True),
        TensorSpec("sample_rate", "TYPE_INT32", (1,)),
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
        SPEECH,
    )
    outputs = (
        TensorSpec("audio", "TYPE_STRING", (1,)),
        TensorSpec("sample_rate", "TYPE_INT32", (1,)),
        TensorSpec("finish_reason", "TYPE_STRING", (1,)),
    )
    Params = SpeechPostParams

    def input_limits(self) -> dict:
        return {"waveform": (max_samples(self.params.max_seconds),)}

    def one(self, req: Request) -> dict:
        speech = Speech.from_request(req)
        wave, rate = waveform(req, self.params.max_seconds)
        if speech.stream:
            data = audio.pcm_bytes(wave)
        else:
            data = audio.encode(wave, rate, speech.response_format)
            rate = audio.file_rate(speech.response_format, rate)
        return {"audio": np.array([data], dtype=np.object_),
                "sample_rate": np.asarray([rate], dtype=np.int32),
                "finish_reason": req.get("finish_reason")}

