"""The speech post step: waveform -> what the client gets (the OpenAI `speech` route's outputs).

Streaming: each response's audio is a raw PCM chunk (s16le, mono, `sample_rate`). Otherwise the one
response carries the whole file in `response_format`. Stateless, so it batches freely; one
instance keeps a stream's chunks in order (as the chat detokenizer).
"""
from __future__ import annotations

import numpy as np

from triton_omni.media import audio
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, register
from triton_omni.tts.request import SPEECH, Speech


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

    def one(self, req: Request) -> dict:
        speech = Speech.from_request(req)
        wave, rate = req.get("waveform"), int(req.scalar("sample_rate"))
        if speech.stream:
            data = audio.pcm_bytes(wave)
        else:
            data = audio.encode(wave, rate, speech.response_format)
            rate = audio.file_rate(speech.response_format, rate)
        return {"audio": np.array([data], dtype=np.object_),
                "sample_rate": np.asarray([rate], dtype=np.int32),
                "finish_reason": req.get("finish_reason")}

