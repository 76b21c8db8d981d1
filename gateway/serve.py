"""Run the gateway in production: handler cancellation on, SIGTERM drain, SIGHUP reload.

`web.run_app` leaves handler cancellation off and knows nothing of draining,
so the gateway runs its own AppRunner: on SIGTERM (or SIGINT) /ready turns 503
and new requests are refused at once, in-flight answers get `server.drain_s`
to finish, then what is left is cancelled (closing the upstream connections,
so vLLM aborts them) and the process exits 0. SIGHUP re-reads the config file;
a bad file is logged and the running config stays.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable

import structlog
from aiohttp import web

from gateway.app import create_app
from gateway.config import Config, ConfigError
from gateway.state import BACKENDS, RUNTIME

log = structlog.get_logger("specroute.serve")


async def serve(
    config: Config,
    reread: Callable[[], Config] | None = None,
    *,
    ready: asyncio.Event | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT; `reread` gives the config anew on SIGHUP."""
    app = create_app(config)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, config.server.host, config.server.port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if reread is not None:
        loop.add_signal_handler(signal.SIGHUP, reload, app, reread)
    log.info("serving", host=config.server.host, port=config.server.port)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
        await drain(app)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
    log.info("stopped")


async def drain(app: web.Application) -> None:
    """Refuse new work, let in-flight answers finish for up to drain_s."""
    runtime = app[RUNTIME]
    runtime.draining = True
    deadline = time.monotonic() + runtime.current.config.server.drain_s
    pool = app[BACKENDS]
    inflight = sum(b.inflight for b in pool)
    log.info("draining", inflight=inflight, drain_s=runtime.current.config.server.drain_s)
    while inflight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        inflight = sum(b.inflight for b in pool)
    if inflight:
        log.warning("drain_timeout", cancelled=inflight)


def reload(app: web.Application, reread: Callable[[], Config]) -> bool:
    """Re-read the config and swap it in atomically; keep the old one on any error."""
    try:
        changed = app[RUNTIME].reload(reread())
    except ConfigError as exc:
        log.error("config_reload_rejected", error=str(exc))
        return False
    log.info("config_reloaded", changed=changed)
    return True
