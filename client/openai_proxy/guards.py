"""Who may call the proxy, and how often: API keys (401), a request rate per key (429), CORS.

Keys come from `--api-key`, `--api-key-file` (one a line) and $OPENAI_PROXY_API_KEYS (a comma-separated
list); a request sends one as `Authorization: Bearer KEY`. The sent key is compared with every key,
in constant time (hmac.compare_digest over SHA-256 digests: neither a key's length nor which key
matched shows in the timing). The rate limit is a token bucket per key (per client address when the
proxy is open): `burst` requests at once, refilled at `per_minute` a minute; past it, 429 with
`Retry-After` (whole seconds until the next request may go). `/health` needs neither. The realtime
WebSocket checks both with `admit` before it accepts the socket (one token a session).
"""
from __future__ import annotations

import hashlib
import hmac
import math
import os
import time
from pathlib import Path
from typing import Callable, Iterable

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware

from triton_omni.client.openai_proxy.context import proxy_of
from triton_omni.client.openai_proxy.errors import ProxyError
from triton_omni.client.openai_proxy.fields import refuse

KEYS_ENV = ("OPENAI_PROXY_API_KEYS", "OPENAI_PROXY_API_KEY")     # the second: the name of earlier versions
MAX_CLIENTS = 10_000        # rate buckets kept; past it, the full ones (clients idle a while) are dropped


def read_api_keys(keys: Iterable[str] = (), files: Iterable[Path] = (), environ=os.environ) -> tuple[str, ...]:
    """The keys given, those of each file (one a line; blank lines and `#` comments skipped) and
    those of the environment variables KEYS_ENV (comma-separated), in that order, without repeats.
    A file without a key is an error: a proxy meant to be closed must not start open."""
    found = [k.strip() for k in keys]
    for path in files:
        in_file = [line.strip() for line in Path(path).read_text().splitlines()]
        in_file = [k for k in in_file if k and not k.startswith("#")]
        if not in_file:
            raise ValueError(f"{path} holds no API key")
        found += in_file
    for name in KEYS_ENV:
        found += [k.strip() for k in environ.get(name, "").split(",")]
    return tuple(dict.fromkeys(k for k in found if k))


class KeyRing:
    def __init__(self, keys: Iterable[str]):
        self.digests = [hashlib.sha256(k.encode()).digest() for k in keys]

    def match(self, key: str) -> bytes | None:
        """The digest of the key sent when it is one of ours (every key is compared, whatever matches)."""
        given = hashlib.sha256(key.encode()).digest()
        matched = None
        for digest in self.digests:
            if hmac.compare_digest(given, digest):
                matched = digest
        return matched


class RateLimiter:
    """A token bucket per client: up to `burst` requests at once, refilled at `per_minute` a minute."""

    def __init__(self, per_minute: float, burst: int | None = None, clock: Callable[[], float] = time.monotonic):
        self.rate = per_minute / 60.0                          # tokens a second
        self.burst = max(1, burst if burst is not None else math.ceil(per_minute))
        self.clock = clock
        self.buckets: dict[object, tuple[float, float]] = {}   # client -> (tokens, when counted)

    def take(self, client: object) -> float:
        """0 when this request may go (a token is spent); else the seconds until one may."""
        now = self.clock()
        tokens, then = self.buckets.get(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        if tokens >= 1:
            self.buckets[client] = (tokens - 1, now)
            if len(self.buckets) > MAX_CLIENTS:
                self._drop_full(now)
            return 0.0
        self.buckets[client] = (tokens, now)
        return (1 - tokens) / self.rate

    def _drop_full(self, now: float) -> None:
        full = [c for c, (tokens, then) in self.buckets.items() if tokens + (now - then) * self.rate >= self.burst]
        for client in full:
            del self.buckets[client]


def admit(proxy, authorization: str, host: str | None) -> ProxyError | None:
    """The API key (401), then the caller's rate (429): None when the call may go. Shared by the
    HTTP routes (`guard`) and the realtime WebSocket (realtime.py)."""
    client: object = host or "unknown"
    if proxy.keys is not None:
        scheme, _, token = authorization.partition(" ")
        client = proxy.keys.match(token.strip()) if scheme.lower() == "bearer" else None
        if client is None:
            return ProxyError(401, "Incorrect API key provided" if authorization else "Missing API key: send "
                              "'Authorization: Bearer <key>'", code="invalid_api_key")
    if proxy.limiter is not None:
        wait = proxy.limiter.take(client)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            rate = proxy.settings.rate_limit_per_minute
            return ProxyError(429, f"Rate limit reached: at most {rate:g} requests a minute; retry in {seconds} s",
                              code="rate_limit_exceeded", headers={"Retry-After": str(seconds)})
    return None


async def guard(request: Request) -> None:
    """The dependency of every /v1 route: the API key (401), then the caller's rate (429)."""
    error = admit(proxy_of(request), request.headers.get("authorization", ""),
                  request.client.host if request.client else None)
    if error is not None:
        await refuse(request, error)


def add_cors(app: FastAPI, origins: Iterable[str]) -> None:
    """CORS headers for these origins only; without origins none are sent (browsers then refuse
    cross-origin calls). Preflight requests are answered here, before the key check."""
    origins = list(origins)
    if not origins:
        return
    app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                       allow_headers=["Authorization", "Content-Type"],
                       expose_headers=["Retry-After", "x-audio-sample-rate", "x-audio-channels"])
