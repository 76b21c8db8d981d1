"""The gateway's own service endpoints: /health, /ready, /metrics, /openapi.json."""

from __future__ import annotations

import importlib.resources

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.backends.models import lacking, readiness_problem, served
from gateway.errors import error_response
from gateway.state import BACKENDS, METRICS, RUNTIME, SESSION


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
    # Routes that serve no model in common cannot stand in for each other, and a request
    # for a model one lacks can go to the other only (gateway/backends/models.py).
    if (problem := readiness_problem(pool)) is not None:
        return error_response(503, problem, code="not_ready")
    # Whether the speculative server sends per-request metrics (null until a
    # speculative answer says), and so where the router's acceptance comes from.
    sources = pool.sources
    lacks = lacking(pool)
    return web.json_response(
        {
            "status": "ready",
            "backends": backends,
            "models": {
                b.route.value: sorted(m) if (m := served(b)) is not None else None for b in pool
            },
            # What another route serves and this one does not: a request for it avoids it.
            "lacking": {r.value: None if m is None else sorted(m) for r, m in lacks.items()},
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
