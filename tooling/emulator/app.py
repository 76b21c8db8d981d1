"""create_emulator_app: the one way to build an emulated vLLM server.

Routes, as vLLM's OpenAI server has them: /v1/chat/completions, /v1/completions,
/v1/models, /health, /metrics, /version. Plus the emulator's own admin paths,
which vLLM does not have: GET /emulator/state (engine counts, aborts included,
the current faults and, in speculative modes, the steps per proposed K), POST
/emulator/faults (set faults), DELETE /emulator/faults (clear them).

The engine loop and the Prometheus registry belong to the app: the loop is
started and stopped in a cleanup_ctx, the registry is created per app, so two
emulators (baseline and speculative) run side by side in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from . import protocol
from .config import EmulatorConfig
from .costs import describe_gpu
from .engine import Engine, SharedGpu
from .faults import Faults, reset_connection
from .generation import EMULATOR, EmulatorState, chat_completions, completions
from .metrics import VllmMetrics
from .protocol import ApiError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_ADMIN = "/emulator/"


def create_emulator_app(config: EmulatorConfig, gpu: SharedGpu | None = None) -> web.Application:
    """An aiohttp app that behaves like `vllm serve` for config.model, timed like an engine.

    Pass the same `gpu` to two apps in one process to have them share one GPU.
    """
    app = web.Application(middlewares=[_errors_and_refusals])
    metrics = VllmMetrics(config)
    engine = Engine(config, metrics, gpu)
    app[EMULATOR] = EmulatorState(config, metrics, engine, Faults(config))
    app.cleanup_ctx.append(_engine_loop)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/version", _version)
    app.router.add_get(_ADMIN + "state", _state)
    app.router.add_post(_ADMIN + "faults", _set_faults)
    app.router.add_delete(_ADMIN + "faults", _clear_faults)
    return app


async def _engine_loop(app: web.Application) -> AsyncIterator[None]:
    engine = app[EMULATOR].engine
    task = asyncio.create_task(engine.run(), name="emulator-engine")
    yield
    engine.shutdown()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@web.middleware
async def _errors_and_refusals(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse connections when told to; render every error as vLLM (FastAPI) does."""
    if request.app[EMULATOR].faults.refusing and not request.path.startswith(_ADMIN):
        reset_connection(request)
        return web.Response(status=503)  # never reaches the client: the socket is gone
    try:
        return await handler(request)
    except ApiError as exc:
        return web.json_response(
            protocol.error_body(exc.message, exc.status, exc.param), status=exc.status
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response({"detail": exc.reason}, status=exc.status)  # FastAPI's shape
    except Exception:
        log.exception("emulator handler failed")
        return web.json_response(protocol.error_body("Internal server error", 500), status=500)


async def _models(request: web.Request) -> web.Response:
    """vLLM's ModelList for the one served model."""
    c = request.app[EMULATOR].config
    card = {
        "id": c.model,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "vllm",
        "root": c.model,
        "parent": None,
        "max_model_len": c.max_model_len,
        "permission": [
            {
                "id": "modelperm-emulated",
                "object": "model_permission",
                "created": 0,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
    return web.json_response({"object": "list", "data": [card]})


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[EMULATOR].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _version(request: web.Request) -> web.Response:
    """vLLM's {"version"}, marked as emulated, and the GPU the timing models: the
    gateway's page reads it to say EMULATED, and on what."""
    c = request.app[EMULATOR].config
    emulated = {"gpu_profile": c.gpu_profile, "gpu": describe_gpu(c)}
    return web.json_response({"version": "0.32.0+emulated", "emulated": emulated})


async def _state(request: web.Request) -> web.Response:
    """What the engine did, including client aborts (which vLLM 0.32 does not count)."""
    s = request.app[EMULATOR]
    counts = s.engine.counts
    return web.json_response(
        {
            "emulated": True,
            "mode": s.config.mode,
            "model": s.config.model,
            "time_scale": s.config.time_scale,
            "gpu": describe_gpu(s.config),
            "running": s.engine.num_running,
            "waiting": s.engine.num_waiting,
            "kv_cache_usage": s.engine.kv_usage(),
            "submitted": counts.submitted,
            "finished": dict(counts.finished),
            "client_aborts": counts.client_aborts,
            "faults": s.faults.to_dict(),
            **_drafting(s),
        }
    )


def _drafting(s: EmulatorState) -> dict[str, object]:
    """Speculative modes: k, the dynamic schedule, and how many steps proposed each K."""
    c = s.config
    if not c.speculative:
        return {}
    out: dict[str, object] = {
        "num_speculative_tokens": c.num_speculative_tokens,
        "steps_by_k": {str(k): n for k, n in sorted(s.engine.counts.steps_by_k.items())},
    }
    if c.mode == "dynamic":
        schedule = c.num_speculative_tokens_per_batch_size or ()
        out["num_speculative_tokens_per_batch_size"] = [list(e) for e in schedule]
    return out


async def _set_faults(request: web.Request) -> web.Response:
    try:
        changes = await request.json()
    except ValueError as exc:
        raise ApiError(f"Invalid JSON body: {exc}") from exc
    if not isinstance(changes, dict):
        raise ApiError("faults must be a JSON object")
    try:
        request.app[EMULATOR].faults.update(changes)
    except ValueError as exc:
        raise ApiError(str(exc)) from exc
    return web.json_response(request.app[EMULATOR].faults.to_dict())


async def _clear_faults(request: web.Request) -> web.Response:
    request.app[EMULATOR].faults.clear()
    return web.json_response(request.app[EMULATOR].faults.to_dict())
