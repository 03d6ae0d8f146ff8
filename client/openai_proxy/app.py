"""The proxy's FastAPI app: OpenAI's routes over the models Triton serves, errors in OpenAI's shape.

Each served model's config says which endpoint it serves (its `openai_route` parameter, models.py);
the handlers map the OpenAI request onto the tensor contract of ensemble_configs/README.md and talk
gRPC to Triton.
"""
from __future__ import annotations

import time
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request

from triton_omni.client.openai_proxy import (audio, chat, completions, embeddings, images, metrics, playground,
                                          realtime, transcriptions, videos)
from triton_omni.client.openai_proxy.context import Proxy, Settings, proxy_of
from triton_omni.client.openai_proxy.errors import ProxyError, install
from triton_omni.client.openai_proxy.guards import KeyRing, RateLimiter, add_cors, guard
from triton_omni.client.openai_proxy.models import ModelTable
from triton_omni.client.openai_proxy.triton import ClientGone, TritonGateway
from triton_omni.client.openai_proxy.voices import VoiceStore


models_router = APIRouter()


def model_object(m) -> dict:
    return {"id": m.name, "object": "model", "created": m.created, "owned_by": "triton-omni",
            "route": m.route, "description": m.description}


@models_router.get("/v1/models")
async def list_models(request: Request):
    return {"object": "list", "data": [model_object(m) for m in await proxy_of(request).models.served()]}


@models_router.get("/v1/models/{model_id}")
async def get_model(request: Request, model_id: str):
    for m in await proxy_of(request).models.served():
        if m.name == model_id:
            return model_object(m)
    raise ProxyError(404, f"The model '{model_id}' does not exist", param="model", code="model_not_found")


def create_app(settings: Settings) -> FastAPI:
    gateway = TritonGateway(settings.triton_url, settings.request_timeout_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        gateway.close()

    app = FastAPI(title="triton-omni OpenAI-compatible proxy", version="1", lifespan=lifespan)
    app.state.proxy = Proxy(settings, gateway, ModelTable(gateway),
                            VoiceStore(settings.voices_dir), videos.VideoJobs(gateway, settings.max_video_jobs),
                            keys=KeyRing(settings.api_keys) if settings.api_keys else None,
                            limiter=(RateLimiter(settings.rate_limit_per_minute, settings.rate_limit_burst)
                                     if settings.rate_limit_per_minute > 0 else None))
    install(app)
    add_cors(app, settings.cors_origins)
    metrics.install(app)               # GET /metrics, and the timing of every request
    app.include_router(playground.router)   # GET /playground: a page that calls the routes below

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone):
        return ProxyError(499, "client closed the request", code="client_closed").response()

    @app.get("/health")
    async def health(request: Request):
        """200 while Triton is live (no key needed: for load balancers)."""
        if await proxy_of(request).gateway.live():
            return {"status": "ok", "time": int(time.time())}
        raise ProxyError(503, "the Triton server is unavailable", code="triton_unavailable")

    app.include_router(realtime.router)     # WebSocket /v1/realtime: checks the key itself (guards.admit)
    secured = [Depends(guard)]
    for router in (models_router, chat.router, completions.router, audio.router, transcriptions.router,
                   images.router, videos.router, embeddings.router):
        app.include_router(router, dependencies=secured)
    return app
