"""The speech post step: waveform -> what the client gets (the OpenAI `speech` route's outputs).

Streaming: each response's audio is a raw PCM chunk (s16le, mono, `sample_rate`). Otherwise the one
response carries the whole file in `response_format`. Stateless, so it batches freely; one
instance keeps a stream's chunks in order (as the chat detokenizer).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from triton_omni.media import audio
from triton_omni.media.audio import RESPONSE_FORMATS
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register, string_array
from triton_omni.tts.checks import MAX_AUDIO_SECONDS, max_samples, waveform
from triton_omni.tts.request import SPEECH, Speech
from triton_omni.tts.speech_metrics import SpeechMetrics


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

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        self.metrics = SpeechMetrics(ctx.model_name)

    def input_limits(self) -> dict:
        return {"waveform": (max_samples(self.params.max_seconds),)}

    def warmup_inputs(self, spec) -> list[dict]:
        """Half a second of noise as a streamed PCM chunk and as each file format (each encoder's first use)."""
        wave = np.random.default_rng(0).uniform(-0.5, 0.5, 12000).astype(np.float32)
        common = {"waveform": wave, "sample_rate": np.array([24000], np.int32), "finish_reason": string_array("stop")}
        return [{**common, "speech": Speech(0, fmt, fmt == "pcm").tensor()} for fmt in RESPONSE_FORMATS]

    def one(self, req: Request) -> dict:
        speech = Speech.from_request(req)
        wave, rate = waveform(req, self.params.max_seconds)
        if speech.stream:
            data = audio.pcm_bytes(wave)
        else:
            data = audio.encode(wave, rate, speech.response_format)
        self.metrics.chunk(req.request_id, speech.arrival, speech.seed, len(wave), rate,
                           final=bool(req.string("finish_reason")))
        if not speech.stream:
            rate = audio.file_rate(speech.response_format, rate)
        return {"audio": np.array([data], dtype=np.object_),
                "sample_rate": np.asarray([rate], dtype=np.int32),
                "finish_reason": req.get("finish_reason")}

