"""The OpenAI API under /v1: chat/completions, completions and responses, each run
through the request pipeline (gateway/request/pipeline.py); a stored response's
GET and cancel, forwarded to the server that stored it; the backends' models."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from classifier.features import Endpoint
from gateway.api.passthrough import forward, targets_for
from gateway.backends.models import model_cards, routes_serving
from gateway.errors import APIError, draining
from gateway.request.pipeline import generate
from gateway.request.responses import owner_of
from gateway.state import BACKENDS, RUNTIME, SESSION


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, Endpoint.CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, Endpoint.COMPLETIONS)


async def create_response(request: web.Request) -> web.StreamResponse:
    return await generate(request, Endpoint.RESPONSES)


async def stored(request: web.Request) -> web.StreamResponse:
    """GET /v1/responses/{response_id} and POST .../cancel: to the server that stored
    it; an id no server has goes to any healthy one, which answers vLLM's own 404."""
    owner = await owner_of(request.app, request.match_info["response_id"])
    pool = request.app[BACKENDS]
    targets = [(pool.of(owner.route), owner.upstream)] if owner else targets_for(request)
    return await forward(request, targets)


async def models(request: web.Request) -> web.Response:
    """The union of the backends' models (they normally serve the same one), each with
    the routes that serve it (`specroute_routes`: those where every server that answered
    lists it): a model some route lacks is sent to the others only, one no route
    serves whole is a 404 (gateway/backends/models.py)."""
    app = request.app
    if app[RUNTIME].draining:
        raise draining()
    session = app[SESSION]
    timeout = app[RUNTIME].current.config.upstream.health_timeout_s
    urls = [(b, u.url) for b in app[BACKENDS] for u in b.upstreams]
    answers = await asyncio.gather(
        *(model_cards(session, url, b.headers, timeout) for b, url in urls)
    )
    seen: dict[str, dict[str, Any]] = {}
    for cards in answers:
        for model, card in (cards or {}).items():
            seen.setdefault(model, card)
    if not any(a is not None for a in answers):
        raise APIError(502, "no backend answered /v1/models", code="upstream_unavailable")
    routes = routes_serving((b.route, cards) for (b, _), cards in zip(urls, answers, strict=True))
    listed = [
        {**card, "specroute_routes": [r.value for r in routes.get(model, [])]}
        for model, card in seen.items()
    ]
    return web.json_response({"object": "list", "data": listed})
