"""HTTP handlers: the routed endpoints, which run the request pipeline
(gateway/request/pipeline.py), and the gateway's own answers."""

from __future__ import annotations

import asyncio
import importlib.resources
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from classifier.features import Endpoint
from gateway.errors import APIError, draining, error_response
from gateway.passthrough import forward, targets_for
from gateway.request.pipeline import generate
from gateway.request.responses import owner_of
from gateway.state import BACKENDS, METRICS, RUNTIME, SESSION


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
    try:
        async with session.get(
            f"{base_url}/v1/models",
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            if resp.status != 200:
                return None
            payload = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    data = payload.get("data") if isinstance(payload, dict) else None
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else None


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    """From the health prober's last results: a readiness probe must not become
    a load generator for the backends' /health (1,000 calls/s would be 2,000)."""
    app = request.app
    if app[RUNTIME].draining:
        return error_response(503, "the gateway is shutting down", code="draining")
    pool = app[BACKENDS]
    if not pool.probed:  # before the prober's first round: ask now, once
        await pool.probe_all(app[SESSION], app[RUNTIME].current.config.upstream.health_timeout_s)
    backends = {b.route.value: b.healthy for b in pool}
    if not any(b.healthy or b.reachable for b in pool):
        return error_response(503, f"no backend is healthy: {backends}", code="not_ready")
    # Whether the speculative server sends per-request metrics (null until a
    # speculative answer says), and so where the router's acceptance comes from.
    sources = pool.sources
    return web.json_response(
        {
            "status": "ready",
            "backends": backends,
            "per_request_metrics": sources.per_request_metrics,
            "acceptance_source": sources.in_use,
        }
    )


_OPENAPI = importlib.resources.files("gateway").joinpath("openapi.json").read_bytes()


async def openapi(request: web.Request) -> web.Response:
    """The gateway's own OpenAPI description (the fields it reads and its errors)."""
    return web.Response(body=_OPENAPI, content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
