"""Which model serves which OpenAI route: read from Triton's model configs, for the models it has ready.

The converter writes an ensemble YAML's `openai: {route: ...}` and its description into the config of
the model clients call (the front of a streaming model, else the ensemble) as the parameters
`openai_route` and `openai_description` (converters/generate.py). The proxy asks Triton for them, so
it needs only the server's address: no YAMLs, no serving code. A model is served only while the
live Triton server reports it READY, so `/v1/models` says what really answers.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from triton_omni.client.openai_proxy.errors import ProxyError

log = logging.getLogger("openai_proxy")

# openai.route -> the path that serves it
ROUTES = {
    "chat": "/v1/chat/completions",
    "speech": "/v1/audio/speech",
    "transcription": "/v1/audio/transcriptions",
    "image_generation": "/v1/images/generations",
    "image_edit": "/v1/images/edits",
    "video": "/v1/videos",
    "embeddings": "/v1/embeddings",
}
ROUTE_PARAMETER, DESCRIPTION_PARAMETER = "openai_route", "openai_description"


@dataclass(frozen=True)
class ServedModel:
    name: str
    route: str
    description: str
    created: int          # when this proxy first saw it ready: OpenAI's `created`
    batched: bool = True  # inputs with a batch dimension (max_batch_size > 0); the chat models' fronts: none
    inputs: frozenset = frozenset()     # its input tensors' names (what a request may carry: images, video, ...)


def served_model(name: str, config: dict) -> ServedModel | None:
    """The model a Triton model config (JSON form) offers, or None when it has no known route."""
    params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
    route = params.get(ROUTE_PARAMETER)
    if route is None:
        return None
    if route not in ROUTES:
        log.warning("skipping %s: unknown openai_route %r (known: %s)", name, route, ", ".join(ROUTES))
        return None
    return ServedModel(name, route, params.get(DESCRIPTION_PARAMETER, ""), int(time.time()),
                       int(config.get("max_batch_size", 0)) > 0,
                       frozenset(i.get("name", "") for i in config.get("input", [])))


class ModelTable:
    def __init__(self, gateway):
        self.gateway = gateway
        # name -> its model (None: not an OpenAI model), for the models last seen ready; a model that
        # leaves the ready set is forgotten, so a reload with a new config is read again
        self.known: dict[str, ServedModel | None] = {}

    async def served(self) -> list[ServedModel]:
        ready = await self.gateway.ready_models()
        self.known = {name: m for name, m in self.known.items() if name in ready}
        for name in sorted(ready - set(self.known)):
            try:
                self.known[name] = served_model(name, await self.gateway.model_config(name))
            except ProxyError as e:      # unloaded between the two calls: ask again next time
                log.warning("skipping %s: %s", name, e.message)
        return [m for m in self.known.values() if m is not None]

    async def resolve(self, route: str, name: str | None) -> ServedModel:
        """The model for this request. `name` None: the route's only served model, if it has one."""
        served = await self.served()
        serving = [m for m in served if m.route == route]
        path = ROUTES[route]
        if not serving:
            raise ProxyError(404, f"no model serves this route ({path}): no ensemble with openai.route "
                                  f"'{route}' is ready on the Triton server", param="model", code="model_not_found")
        if name is None:
            if len(serving) == 1:
                return serving[0]
            raise ProxyError(400, f"'model' is required: {path} is served by {', '.join(m.name for m in serving)}",
                             param="model", code="missing_required_parameter")
        for m in serving:
            if m.name == name:
                return m
        other = next((m for m in served if m.name == name), None)
        hint = (f"; it serves {ROUTES[other.route]}" if other is not None
                else f"; {path} is served by {', '.join(m.name for m in serving)}")
        raise ProxyError(404, f"The model '{name}' does not exist or is not served on {path}{hint}",
                         param="model", code="model_not_found")
