"""The OpenAI API under /v1: chat/completions, completions and responses, each run
through the request pipeline (gateway/request/pipeline.py); a stored response's
GET and cancel, forwarded to the server that stored it; the backends' models."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web

from classifier.features import Endpoint
from gateway.api.passthrough import forward, targets_for
from gateway.backends.scraper import read_limited
from gateway.errors import APIError, draining
from gateway.request.pipeline import generate
from gateway.request.responses import owner_of
from gateway.state import BACKENDS, RUNTIME, SESSION

# A models list is a few KB; a longer answer is a bad one, and is not read to its end.
MAX_MODELS_BYTES = 2**20


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
    """The union of the backends' models (they normally serve the same one)."""
    app = request.app
    if app[RUNTIME].draining:
        raise draining()
    session = app[SESSION]
    timeout = app[RUNTIME].current.config.upstream.health_timeout_s
    urls = [(b, u.url) for b in app[BACKENDS] for u in b.upstreams]
    answers = await asyncio.gather(
        *(_get_models(session, url, b.headers, timeout) for b, url in urls)
    )
    seen: dict[str, dict[str, Any]] = {}
    for data in answers:
        for model in data or ():
            seen.setdefault(str(model.get("id")), model)
    if not any(a is not None for a in answers):
        raise APIError(502, "no backend answered /v1/models", code="upstream_unavailable")
    return web.json_response({"object": "list", "data": list(seen.values())})


async def _get_models(
    session: aiohttp.ClientSession, base_url: str, headers: dict[str, str], timeout_s: float
) -> list[dict[str, Any]] | None:
    """A backend's models, or None for any bad answer: not 200, too long, no JSON, JSON
    too deep for the parser (a RecursionError, not a ValueError), no list of objects."""
    try:
        async with session.get(
            f"{base_url}/v1/models",
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            if resp.status != 200:
                return None
            body = await read_limited(resp, MAX_MODELS_BYTES)
        payload = json.loads(body) if body is not None else None
    except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError):
        return None
    data = payload.get("data") if isinstance(payload, dict) else None
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else None
