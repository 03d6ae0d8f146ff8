"""Which model serves which OpenAI route: read from the ensemble YAMLs, filtered by what Triton has ready.

Every `ensemble_configs/*.yaml` with `openai: {route: ...}` offers its model, under the YAML's name
(the model clients call: the front of a streaming model, else the ensemble). A model is served only
while the live Triton server reports it READY, so `/v1/models` says what really answers.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

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
}


@dataclass(frozen=True)
class ServedModel:
    name: str
    route: str
    description: str
    created: int          # the YAML's modification time: OpenAI's `created`


def load_models(config_dir: Path) -> dict[str, ServedModel]:
    """name -> model for every YAML with an OpenAI route. A YAML that does not load is skipped
    (logged), so one broken config never takes the proxy down."""
    from triton_omni.converters.schema import load_ensemble

    models = {}
    for path in sorted(Path(config_dir).glob("*.yaml")):
        try:
            cfg = load_ensemble(path)
        except Exception as e:  # noqa: BLE001
            log.warning("skipping %s: %s", path.name, e)
            continue
        route = cfg.openai.get("route")
        if route is None:
            continue
        if route not in ROUTES:
            log.warning("skipping %s: unknown openai.route %r (known: %s)", path.name, route, ", ".join(ROUTES))
            continue
        models[cfg.name] = ServedModel(cfg.name, route, cfg.description, int(path.stat().st_mtime))
    return models


class ModelTable:
    def __init__(self, models: dict[str, ServedModel], gateway):
        self.models = models
        self.gateway = gateway

    async def served(self) -> list[ServedModel]:
        ready = await self.gateway.ready_models()
        return [m for m in self.models.values() if m.name in ready]

    async def resolve(self, route: str, name: str | None) -> ServedModel:
        """The model for this request. `name` None: the route's only served model, if it has one."""
        serving = [m for m in await self.served() if m.route == route]
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
        other = self.models.get(name)
        hint = (f"; it serves {ROUTES[other.route]}" if other is not None and other.route != route
                else f"; {path} is served by {', '.join(m.name for m in serving)}")
        raise ProxyError(404, f"The model '{name}' does not exist or is not served on {path}{hint}",
                         param="model", code="model_not_found")
