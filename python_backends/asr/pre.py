"""The transcription models' pre step: a request's audio decoded (16 kHz mono), checked, and cut into
the segments its model takes (segment.py), with its options for the steps after it.

Outputs: `samples` (every segment's samples, one after another), `segment_spans` ([N, 4]: start,
length, keep_from, keep_to in samples of the request's audio) and `transcription` (request.Options).
Silent audio has no segment when segmentation is `vad`: its transcript is empty.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from triton_omni.asr.request import INPUTS, RATE, TRANSCRIPTION, Abilities, Options, parse_options, read_audio
from triton_omni.asr.segment import Segment, SegmentSettings, as_array, plan
from triton_omni.runtime.spec import TensorSpec
from triton_omni.runtime.step import Request, Step, StepContext, register

SAMPLES = TensorSpec("samples", "TYPE_FP32", (-1,))
SEGMENT_SPANS = TensorSpec("segment_spans", "TYPE_INT64", (-1, 4))


@dataclass
class ASRPreParams:
    max_audio_seconds: float = 3600.0   # longer audio is refused (decoding stops there)
    min_audio_seconds: float = 0.05
    segmentation: str = "vad"           # vad (Silero VAD, then windows in long speech) or window
    max_segment_seconds: float = 30.0   # within the model's own input limit
    overlap_seconds: float = 2.0        # between windows of one long stretch of speech
    vad_threshold: float = 0.5
    prompt: bool = False                # whether the model reads a prompt (else `prompt` is refused)
    sampling: bool = False              # whether the model samples (else temperature > 0 is refused)
    max_prompt_chars: int = 2048
    translate: bool = False             # whether the model translates (takes task "translate")


@register("asr_pre")
class ASRPre(Step):
    inputs = INPUTS
    outputs = (SAMPLES, SEGMENT_SPANS, TRANSCRIPTION)
    Params = ASRPreParams

    def __init__(self, ctx: StepContext):
        super().__init__(ctx)
        p = self.params
        if p.segmentation not in ("vad", "window"):
            raise ValueError(f"parameter 'segmentation': expected vad or window, got {p.segmentation!r}")
        if not 0 <= p.overlap_seconds < p.max_segment_seconds / 2:
            raise ValueError("parameter 'overlap_seconds': must be below half of max_segment_seconds")
        self.settings = SegmentSettings(p.max_segment_seconds, p.overlap_seconds)
        self.abilities = Abilities(p.prompt, p.sampling, p.max_prompt_chars, p.translate)
        self.vad = self.vad_settings = None
        if p.segmentation == "vad":
            from triton_omni.asr.vad import SileroVAD, VADSettings

            self.vad, self.vad_settings = SileroVAD.load(), VADSettings(threshold=p.vad_threshold)

    def prepare(self, req: Request) -> tuple[Options, list[Segment], np.ndarray]:
        """The request's options, its segments and their samples (one after another)."""
        wave = read_audio(req, self.params.max_audio_seconds, self.params.min_audio_seconds)
        options = parse_options(req, self.abilities, wave.size / RATE)
        segments = plan(wave, self.params.segmentation, self.settings, self.vad, self.vad_settings)
        samples = np.concatenate([wave[g.start:g.end] for g in segments]) if segments else np.zeros(0, np.float32)
        return options, segments, samples.astype(np.float32, copy=False)

    def one(self, req: Request) -> dict:
        options, segments, samples = self.prepare(req)
        return {"samples": samples, "segment_spans": as_array(segments), "transcription": options.tensor()}
