"""Custom Prometheus metrics on Triton's /metrics endpoint (no-ops outside the server).

Names start with `triton_omni_`; every metric carries the step model's name as its `model` label.
Gauges are sent when set. Counters and histograms are buffered in the process and sent by `flush()`
(the adapter flushes after each execute; a step with threads of its own flushes on its own tick):
each send is a round trip to the server, which a decode loop must not pay per token.
"""
from __future__ import annotations

import contextlib
import threading

# seconds: a token (0.5 ms) to a long video (10 min)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   30.0, 60.0, 120.0, 300.0, 600.0)
# dimensionless ratios (real-time factor: seconds of compute per second of audio)
RATIO_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0)
# rates (images a second)
RATE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0)

_lock = threading.Lock()         # guards the buffers below (any thread may observe)
_families: dict[str, object] = {}
_metrics: list["_Metric"] = []
_pending: list["_Metric"] = []
_paused = False


def _stub_lock():
    from triton_omni.runtime.triton_model import STUB_LOCK   # every call into the stub holds it

    return STUB_LOCK


class _Metric:
    kind = ""

    def __init__(self, name: str, description: str, model: str, buckets=None, **labels: str):
        self._metric = None
        self._buffer: list[float] = []
        try:
            import triton_python_backend_utils as pb_utils
        except ImportError:
            return
        with _stub_lock():
            family = _families.get(name)
            if family is None:
                kind = getattr(pb_utils.MetricFamily, self.kind)
                family = _families[name] = pb_utils.MetricFamily(name=name, description=description, kind=kind)
            extra = {"buckets": list(buckets)} if buckets is not None else {}
            self._metric = family.Metric(labels={"model": model, **labels}, **extra)
        _metrics.append(self)

    def _buffer_value(self, value: float) -> None:
        if self._metric is None or _paused:
            return
        with _lock:
            if not self._buffer:
                _pending.append(self)
            self._buffer.append(float(value))

    def _send(self, values: list[float]) -> None:
        raise NotImplementedError


class Gauge(_Metric):
    kind = "GAUGE"

    def set(self, value: float) -> None:
        if self._metric is not None:
            with _stub_lock():
                self._metric.set(float(value))


class Counter(_Metric):
    """Only goes up (Prometheus' rate() works on it)."""
    kind = "COUNTER"

    def inc(self, value: float = 1.0) -> None:
        if value > 0:
            self._buffer_value(value)

    def _send(self, values: list[float]) -> None:
        self._metric.increment(sum(values))


class Histogram(_Metric):
    kind = "HISTOGRAM"

    def __init__(self, name: str, description: str, model: str, buckets=LATENCY_BUCKETS, **labels: str):
        super().__init__(name, description, model, buckets=buckets, **labels)

    def observe(self, value: float) -> None:
        self._buffer_value(value)

    def _send(self, values: list[float]) -> None:
        for v in values:
            self._metric.observe(v)


class CounterByLabel:
    """One counter per value of one label (e.g. errors by `code`), each made on its first use."""

    def __init__(self, name: str, description: str, model: str, label: str):
        self.args, self.label, self.children = (name, description, model), label, {}

    def inc(self, value_of_label: str, value: float = 1.0) -> None:
        child = self.children.get(value_of_label)
        if child is None:
            child = self.children[value_of_label] = Counter(*self.args, **{self.label: value_of_label})
        child.inc(value)


def flush() -> None:
    """Send what counters and histograms have buffered."""
    global _pending
    if not _pending:
        return
    with _lock:
        todo, _pending = _pending, []
        batches = [(m, m._buffer) for m in todo]
        for m in todo:
            m._buffer = []
    with _stub_lock():
        for metric, values in batches:
            if metric._metric is not None:
                metric._send(values)


@contextlib.contextmanager
def paused():
    """Nothing counted meanwhile (a step's warmup at load is no traffic)."""
    global _paused
    _paused = True
    try:
        yield
    finally:
        _paused = False


def close() -> None:
    """Drop this process's metrics, then their families, while the stub can still free them (at
    interpreter exit, after the stub has unmapped its shared memory, freeing them crashed it)."""
    flush()
    with _stub_lock():
        for m in _metrics:
            m._metric = None
        _metrics.clear()
        _families.clear()
