"""The proxy's own Prometheus metrics, at `GET /metrics` (no API key, like /health: for scrapers).

An ASGI middleware times every request by the route it matched (its path template, so ids in paths
do not make new series): requests by route, method and status, seconds to the response's first
body bytes (for a stream: its first event) and to its end, and requests in flight. Each app has its
own registry (several apps may live in one process, as in the tests).
"""
from __future__ import annotations

import time

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
           600.0)
UNMATCHED = "other"            # a path no route matched (404s of scanners): one series for all


class ProxyMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        labels = ("route", "method")
        self.requests = Counter("triton_omni_proxy_requests", "requests answered, by route, method and status",
                                (*labels, "status"), registry=self.registry)
        self.first_byte = Histogram("triton_omni_proxy_time_to_first_byte_seconds",
                                    "seconds from a request's arrival to its response's first body bytes",
                                    labels, buckets=BUCKETS, registry=self.registry)
        self.latency = Histogram("triton_omni_proxy_request_seconds",
                                 "seconds from a request's arrival to its response's last bytes",
                                 labels, buckets=BUCKETS, registry=self.registry)
        self.in_flight = Gauge("triton_omni_proxy_requests_in_flight", "requests being answered",
                               registry=self.registry)

    def render(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class MetricsMiddleware:
    """Pure ASGI (not BaseHTTPMiddleware): streamed responses pass through untouched, chunk by chunk."""

    def __init__(self, app, metrics: ProxyMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") == "/metrics":
            await self.app(scope, receive, send)
            return
        start, state = time.perf_counter(), {"status": 500, "first": None}

        async def timed_send(message):
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            elif message["type"] == "http.response.body" and state["first"] is None:
                state["first"] = time.perf_counter()
            await send(message)

        method = scope.get("method", "")
        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, timed_send)
        finally:
            self.metrics.in_flight.dec()
            route = getattr(scope.get("route"), "path", UNMATCHED)     # set by routing, inside the app
            end = time.perf_counter()
            self.metrics.requests.labels(route, method, str(state["status"])).inc()
            self.metrics.latency.labels(route, method).observe(end - start)
            if state["first"] is not None:
                self.metrics.first_byte.labels(route, method).observe(state["first"] - start)


def install(app: FastAPI) -> ProxyMetrics:
    metrics = ProxyMetrics()
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics():
        return metrics.render()

    return metrics
