"""Per-request latencies and token counts of an AR step (chat decoders and TTS talkers alike), as
Prometheus histograms and counters (runtime/metrics.py). Measured inside the step: from the request
reaching the engine (`Sequence.arrival`) to its prefill being scheduled (queue time), to its first
token (or frame) reaching the delivery thread (time to first token), to its final response (latency);
time per output token is the rest of the request divided by its tokens after the first."""
from __future__ import annotations

import time

from triton_omni.runtime.metrics import Counter, Histogram


class ARRequestMetrics:
    def __init__(self, model: str):
        def hist(name: str, what: str) -> Histogram:
            return Histogram(f"triton_omni_ar_{name}_seconds", what, model)

        self.queue = hist("queue_time", "seconds a request waited in the engine before its prefill was scheduled")
        self.ttft = hist("time_to_first_token", "seconds from a request reaching the engine to its first token")
        self.tpot = hist("time_per_output_token", "a request's mean seconds per output token after the first")
        self.latency = hist("request_latency", "seconds from a request reaching the engine to its final response")
        self.requests = Counter("triton_omni_ar_requests_total", "requests finished (any reason)", model)
        self.prompt_tokens = Counter("triton_omni_ar_prompt_tokens_total", "prompt tokens of finished requests", model)
        self.generation_tokens = Counter("triton_omni_ar_generation_tokens_total",
                                         "tokens (frames, for talkers) sent to clients", model)

    def finished(self, seq, first_token_at: float, tokens: int) -> None:
        """A request whose final response is out: `seq` its engine sequence (None: it never got one)."""
        if seq is None or not seq.arrival:
            return
        now = time.time()
        self.requests.inc()
        self.prompt_tokens.inc(seq.prompt_len)
        self.generation_tokens.inc(tokens)
        self.latency.observe(now - seq.arrival)
        if seq.scheduled:
            self.queue.observe(seq.scheduled - seq.arrival)
        if first_token_at:
            self.ttft.observe(first_token_at - seq.arrival)
            if tokens > 1:
                self.tpot.observe((now - first_token_at) / (tokens - 1))
