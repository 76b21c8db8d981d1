"""The one app factory: `create_app(config)`, used by `specroute serve` and the tests.

State lives under typed AppKeys and every resource (the ClientSession, the
health prober) is opened and closed in a cleanup_ctx, so a test that builds
an app gets exactly what production runs, and nothing leaks between apps.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from aiohttp import web

from classifier.tokens import TokenCounter, load_tiktoken_counter
from gateway import ui
from gateway.api import decide, passthrough, service, stats, v1
from gateway.auth import Keys, auth_middleware
from gateway.backends.pool import BackendPool
from gateway.config import Config
from gateway.errors import error_middleware
from gateway.outcomes.outcome_log import OutcomeLog
from gateway.outcomes.traffic_sample import Recorder
from gateway.profiling.lifecycle import profile_ctx
from gateway.request.responses import RESPONSE_OWNERS, ResponseOwners
from gateway.runtime import Runtime
from gateway.shadow.results import shadow_log_path
from gateway.shadow.runner import ShadowRunner
from gateway.state import (
    BACKENDS,
    BIG_BODIES,
    BIG_BODY_RATE,
    CONFIG,
    METRICS,
    OUTCOME_LOG,
    PROFILE_PROGRESS,
    RECORDER,
    RELAYS,
    RNG,
    RUNTIME,
    SESSION,
    SHADOWS,
    TOKENS,
    ProfileProgress,
)
from gateway.telemetry import Metrics
from gateway.wire.limits import ByteRate
from gateway.wire.relays import Relays
from gateway.wire.tracing import TRACING, trace_middleware, tracing_ctx


def create_app(
    config: Config, *, tokens: TokenCounter | None = None, forward: bool = True
) -> web.Application:
    """The gateway. With forward=False it forwards nothing: the same state, learning and
    metrics, but only the health, metrics and dry-run routes, for `specroute ext-proc`
    (gateway/extproc), where Envoy carries the requests and the picker decides them."""
    runtime = Runtime(config)
    app = web.Application(
        # Tracing outermost: its span sees the status an error became.
        middlewares=[trace_middleware, error_middleware, auth_middleware(_current_keys)],
        client_max_size=config.server.max_body_bytes,
    )
    metrics = Metrics()
    app[CONFIG] = config
    app[METRICS] = metrics
    app[BACKENDS] = BackendPool(
        config.routes,
        config.backends.pairs,
        metrics,
        scrape_max_age_s=3 * config.upstream.scrape_interval_s,
        eject_after_failures=config.upstream.eject_after_failures,
        eject_s=config.upstream.eject_s,
    )
    app[RUNTIME] = runtime
    app[RELAYS] = Relays()
    app[BIG_BODIES] = asyncio.Semaphore(1)
    app[BIG_BODY_RATE] = ByteRate(config.server.big_body_mb_s * 1e6)
    app[TOKENS] = tokens or load_tiktoken_counter(config.routing.tokenizer)
    app[SHADOWS] = ShadowRunner(config.shadow, app[BACKENDS], metrics, runtime)
    app[PROFILE_PROGRESS] = ProfileProgress()
    app.cleanup_ctx.append(tracing_ctx)  # first: the last spans are sent after the rest ends
    app.cleanup_ctx.append(_client_session)
    app.cleanup_ctx.append(_background_tasks)
    app.cleanup_ctx.append(_outcome_log)
    app.cleanup_ctx.append(_recorder)
    app.cleanup_ctx.append(_shadows)  # after the session and the outcome log: closed first
    app.cleanup_ctx.append(profile_ctx)  # after the session: stopped before it
    app[RNG] = random.Random(config.routing.tuning.seed)
    app[RESPONSE_OWNERS] = ResponseOwners()
    if forward:
        _add_forwarding_routes(app)
    app.router.add_get("/health", service.health)
    app.router.add_get("/ready", service.ready)
    app.router.add_get("/metrics", service.metrics)
    app.router.add_get("/openapi.json", service.openapi)
    # A dry-run decision and the live figures (the side-by-side page reads them).
    app.router.add_post("/decide/v1/chat/completions", decide.chat_completions)
    app.router.add_post("/decide/v1/completions", decide.completions)
    app.router.add_get("/stats", stats.stats)
    if forward:
        # The side-by-side page, and last every other path of vLLM's server, passed
        # through or refused by its fate.
        app.router.add_get(ui.PATH, ui.page)
        app.router.add_get(ui.PATH + "/{name}", ui.page)
        app.router.add_route("*", "/{tail:.*}", passthrough.handle)
    return app


def _add_forwarding_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", v1.chat_completions)
    app.router.add_post("/v1/completions", v1.completions)
    app.router.add_post("/v1/responses", v1.create_response)
    app.router.add_get("/v1/responses/{response_id}", v1.stored)
    app.router.add_post("/v1/responses/{response_id}/cancel", v1.stored)
    app.router.add_get("/v1/models", v1.models)


def _current_keys(request: web.Request) -> Keys:
    return request.app[RUNTIME].current.keys


UPSTREAM_KEEPALIVE_S = 4.0  # under uvicorn's timeout_keep_alive, 5 s


async def _client_session(app: web.Application) -> AsyncIterator[None]:
    upstream = app[CONFIG].upstream
    endpoints = sum(len(route.urls) for route in app[CONFIG].routes.values())
    connector = aiohttp.TCPConnector(
        limit=upstream.pool_size * endpoints,  # pool_size per backend server
        limit_per_host=upstream.pool_size,
        enable_cleanup_closed=False,
        # vLLM's server (uvicorn) closes a connection idle for 5 s; one kept longer here
        # could take a request the server is closing (the real tier's client met it).
        keepalive_timeout=UPSTREAM_KEEPALIVE_S,
    )
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=upstream.connect_timeout_s, sock_read=upstream.read_timeout_s
        ),
        auto_decompress=False,
    ) as session:
        app[SESSION] = session
        yield


async def _background_tasks(app: web.Application) -> AsyncIterator[None]:
    """Health probes and /metrics scrapes: they feed the router, never block it."""
    upstream = app[CONFIG].upstream
    pool, session = app[BACKENDS], app[SESSION]
    tasks = [
        asyncio.create_task(
            pool.run_prober(session, upstream.health_interval_s, upstream.health_timeout_s),
            name="specroute-health-prober",
        ),
        asyncio.create_task(
            pool.run_scraper(session, upstream.scrape_interval_s, upstream.health_timeout_s),
            name="specroute-metrics-scraper",
        ),
    ]
    yield
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _outcome_log(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG].outcome_log
    if not config.path:
        yield
        return
    log = OutcomeLog(
        Path(config.path),
        max_bytes=config.max_bytes,
        backups=config.backups,
        metrics=app[METRICS],
    )
    app[OUTCOME_LOG] = log
    yield
    await asyncio.to_thread(log.close)


async def _recorder(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG].record
    if not config.path:
        yield
        return
    recorder = Recorder(
        Path(config.path),
        app[TOKENS],
        sample_rate=config.sample_rate,
        redaction=config.redaction,
        max_bytes=config.max_bytes,
        backups=config.backups,
    )
    app[RECORDER] = recorder
    yield
    await asyncio.to_thread(recorder.close)


async def _shadows(app: web.Application) -> AsyncIterator[None]:
    """Shadow copies' loop, and their lines beside the outcome log; at shutdown the
    running ones are cancelled (vLLM aborts them)."""
    shadows, config = app[SHADOWS], app[CONFIG].outcome_log
    log = None
    if config.path and app[CONFIG].shadow.enabled:
        path = shadow_log_path(Path(config.path))
        log = OutcomeLog(
            path,
            max_bytes=config.max_bytes,
            backups=config.backups,
            metrics=app[METRICS],
            name="shadows",
        )
    shadows.start(app[SESSION], log, app[TRACING])
    yield
    await shadows.stop()
    if log is not None:
        await asyncio.to_thread(log.close)
