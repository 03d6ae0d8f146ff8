"""Custom Prometheus metrics on Triton's /metrics endpoint (no-ops outside the server)."""
from __future__ import annotations


class Gauge:
    def __init__(self, name: str, description: str, model: str):
        try:
            import triton_python_backend_utils as pb_utils

            family = pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.GAUGE)
            self._metric = family.Metric(labels={"model": model})
            self._family = family
        except (ImportError, AttributeError):
            self._metric = None

    def set(self, value: float) -> None:
        if self._metric is not None:
            self._metric.set(float(value))
