"""Run the gateway in production: handler cancellation on, SIGTERM drain, SIGHUP reload.

`web.run_app` leaves handler cancellation off and knows nothing of draining,
so the gateway runs its own AppRunner: on SIGTERM (or SIGINT) /ready turns 503
and new requests are refused at once, in-flight answers get `server.drain_s`
to finish, then what is left is cancelled (closing the upstream connections,
so vLLM aborts them) and the process exits 0. SIGHUP re-reads the config file,
and the files it names, off the event loop; a bad file is logged and the running
config stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
import uvloop
from aiohttp import web

from gateway.app import create_app
from gateway.config import Config, ConfigError
from gateway.files import off_loop
from gateway.runtime import Candidate
from gateway.state import BACKENDS, RELAYS, RUNTIME
from gateway.telemetry import configure_logging

log = structlog.get_logger("specroute.serve")
_LAST_WRITES_S = 1.0


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run the gateway's coroutine on uvloop: the loop, its transports and timers are
    a proxy's largest share of CPU after the decision, and uvloop's are native
    (docs/benchmarks.md, "Where a request's CPU goes")."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


async def serve(
    config: Config,
    reread: Callable[[], Config] | None = None,
    *,
    ready: asyncio.Event | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT; `reread` gives the config anew on SIGHUP."""
    app = create_app(config)
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=1.0,
        keepalive_timeout=config.server.keepalive_s,
    )
    await runner.setup()
    site = web.TCPSite(runner, config.server.host, config.server.port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    # Without a handler SIGHUP would end the process: with nothing to re-read
    # (started with --backend only) it is logged and the gateway keeps serving.
    reloads = _Reloads(app, reread)
    loop.add_signal_handler(signal.SIGHUP, reloads.signal)
    log.info("serving", host=config.server.host, port=config.server.port)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
        await drain(app)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await reloads.stop()
        await runner.cleanup()
    log.info("stopped")


async def drain(app: web.Application) -> None:
    """Refuse new work, let in-flight answers finish for up to drain_s."""
    runtime = app[RUNTIME]
    runtime.draining = True
    drain_s = runtime.current.config.server.drain_s
    pool = app[BACKENDS]
    log.info("draining", inflight=pool.inflight, drain_s=drain_s)
    inflight = await pool.wait_idle(drain_s)
    if inflight:
        # End what is left as any failed answer ends (an error event and [DONE]),
        # and give those last writes a moment before the runner closes sockets.
        ended = app[RELAYS].end_all()
        log.warning("drain_timeout", inflight=inflight, ended=ended)
        await pool.wait_idle(_LAST_WRITES_S)


def reload(app: web.Application, reread: Callable[[], Config] | None) -> bool:
    """Re-read the config and swap it in atomically; keep the old one on any error.

    Its files are read on the caller's thread: SIGHUP goes through reload_off_loop.
    """
    if reread is None:
        return _skipped()
    try:
        return _swap(app, app[RUNTIME].prepare(reread()))
    except ConfigError as exc:
        return _rejected(exc)


async def reload_off_loop(app: web.Application, reread: Callable[[], Config] | None) -> bool:
    """reload, its reading (config.toml, the keys file, the model) on a thread: a FIFO
    or a slow mount named in the config stalls the reload, never /health."""
    if reread is None:
        return _skipped()
    runtime = app[RUNTIME]
    try:
        return _swap(app, await off_loop(lambda: runtime.prepare(reread())))
    except ConfigError as exc:
        return _rejected(exc)


def _swap(app: web.Application, candidate: Candidate) -> bool:
    """The log level is process-wide, not part of a request's snapshot: it is set
    here, after the line that says the reload happened."""
    changed = app[RUNTIME].swap(candidate)
    log.info("config_reloaded", changed=changed)
    if "logging.level" in changed:
        configure_logging(candidate.config.logging.level)
    return True


def _skipped() -> bool:
    log.warning("config_reload_skipped", why="started without a config file")
    return False


def _rejected(exc: ConfigError) -> bool:
    log.error("config_reload_rejected", error=str(exc))
    return False


class _Reloads:
    """SIGHUPs, one reload at a time off the loop; one that comes during a reload runs
    another after it, with the file as it is then."""

    def __init__(self, app: web.Application, reread: Callable[[], Config] | None) -> None:
        self._app, self._reread = app, reread
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def signal(self) -> None:
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.create_task(self._run(), name="specroute-reload")

    async def _run(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            await reload_off_loop(self._app, self._reread)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
