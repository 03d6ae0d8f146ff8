"""Time to first audio and real-time factor of every speech request, as Prometheus histograms
(runtime/metrics.py), measured where every speech model's audio leaves: the `speech_post` step. Its
one instance sees each stream's chunks in order, so it keeps a little state per stream: when the
request reached the model's pre step (`Speech.arrival`, carried in the `speech` tensor) and the audio
seconds so far. Real-time factor: the request's seconds from arrival to its last chunk, over the
seconds of audio it produced (below 1: faster than real time)."""
from __future__ import annotations

import time

from triton_omni.runtime import warmup
from triton_omni.runtime.metrics import RATIO_BUCKETS, Counter, Histogram

FORGET_S = 900.0           # a stream that never finished (its request failed upstream) is dropped


class SpeechMetrics:
    def __init__(self, model: str):
        self.ttfa = Histogram("triton_omni_tts_time_to_first_audio_seconds",
                              "seconds from a speech request reaching the model to its first audio", model)
        self.rtf = Histogram("triton_omni_tts_real_time_factor",
                             "a speech request's seconds of work per second of audio", model, RATIO_BUCKETS)
        self.requests = Counter("triton_omni_tts_requests_total", "speech requests finished", model)
        self.audio_seconds = Counter("triton_omni_tts_audio_seconds_total", "seconds of audio produced", model)
        self.open: dict[tuple, list[float]] = {}     # stream -> [arrival, audio seconds so far]

    def chunk(self, request_id: str, arrival: float, seed: int, samples: int, rate: int, final: bool) -> None:
        if not arrival or warmup.is_warmup(request_id):
            return                  # a step called without a pre step's arrival time, or the warmup
        now = time.time()
        key = (request_id, arrival, seed)
        entry = self.open.get(key)
        if entry is None:
            self.ttfa.observe(now - arrival)
            entry = self.open[key] = [arrival, 0.0]
            self._forget_stale(now)
        entry[1] += samples / rate if rate > 0 else 0.0
        if final:
            del self.open[key]
            self.requests.inc()
            self.audio_seconds.inc(entry[1])
            if entry[1] > 0:
                self.rtf.observe((now - arrival) / entry[1])

    def _forget_stale(self, now: float) -> None:
        for key in [k for k, (t, _) in self.open.items() if now - t > FORGET_S]:
            del self.open[key]
