"""`specroute ext-proc`: the picker process. A gRPC ExternalProcessor for Envoy, and
beside it the gateway's own app without its forwarding routes (create_app with
forward=False) on an HTTP port: /metrics, /health, /ready, /stats, /decide.

Both run on one event loop and share one app's state: the backends' health
probes and scrapes, the profile, the policy, the metrics registry, the shadow
copies, the outcome log. Only the transport differs from `specroute serve`:
Envoy carries the bytes, the picker decides and reads them as they pass.

The gRPC port also serves the standard `grpc.health.v1.Health` service (for
Envoy's grpc_health_check, Kubernetes' grpc probes, Envoy Gateway's active
health check): SERVING while a backend answers (as /ready says), NOT_SERVING
before that, and from the first moment of a drain. A draining picker refuses
new streams with UNAVAILABLE, which Envoy's failure_mode_allow turns into
fail-open, and lets the open ones finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.backends.models import readiness_problem
from gateway.config import Config
from gateway.extproc.pb import ext_proc_subset_pb2 as pb
from gateway.extproc.stream import Mode, PickerStream
from gateway.state import BACKENDS, METRICS, RUNTIME
from gateway.telemetry import ExtProcMetrics

log = structlog.get_logger("specroute.extproc")
SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
_MAX_MESSAGE = 16 * 1024 * 1024  # a buffered body arrives in one message
_HEALTH_EVERY_S = 0.5  # how often the health service reads the backends' state
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Picker:
    """The ExternalProcessor service: one PickerStream per gRPC stream (per request).
    Its stream counter joins the app's registry here: `serve` never exports it."""

    def __init__(self, app: web.Application, mode: Mode) -> None:
        self.app, self.mode = app, mode
        self.metrics = ExtProcMetrics(app[METRICS].registry)
        self.streams = 0  # open now: each holds its request's in-flight count
        self.idle = asyncio.Event()  # set while no stream is open
        self.idle.set()

    async def process(
        self, requests: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> AsyncIterator[pb.ProcessingResponse]:
        if self.app[RUNTIME].draining:  # Envoy fails open, or tries another picker
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the picker is draining")
        stream = PickerStream(self.app, self.mode)
        self.streams += 1
        self.idle.clear()
        end = "cancelled"
        try:
            async for message in requests:
                for reply in await stream.on(message):
                    yield reply
            end = "closed"
        finally:  # a reset stream (client gone) ends here too, cancelled
            self.metrics.streams.labels(end).inc()
            self.streams -= 1
            if not self.streams:
                self.idle.set()
            stream.close()

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.stream_stream_rpc_method_handler(
            self.process,
            request_deserializer=pb.ProcessingRequest.FromString,
            response_serializer=pb.ProcessingResponse.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(SERVICE, {"Process": method})


class Health(HealthServicer):
    """`grpc.health.v1.Health` for the whole server ("") and for the ExternalProcessor
    service by name: the same answer as /ready, kept current every half second."""

    def __init__(self, app: web.Application) -> None:
        super().__init__()
        self.app = app
        self.status: int = _SERVING  # the servicer starts every service SERVING

    def serving(self) -> bool:
        if self.app[RUNTIME].draining:
            return False
        pool = self.app[BACKENDS]
        return any(b.healthy or b.reachable for b in pool) and readiness_problem(pool) is None

    async def refresh(self) -> None:
        status = _SERVING if self.serving() else _NOT_SERVING
        if status != self.status:
            self.status = status
            for service in ("", SERVICE):
                await self.set(service, status)

    async def Check(  # the gRPC method's name
        self, request: health_pb2.HealthCheckRequest, context: Any
    ) -> health_pb2.HealthCheckResponse:
        await self.refresh()
        return await super().Check(request, context)

    async def watch_state(self) -> None:
        """Keep the statuses current for Watch streams (Check refreshes on its own)."""
        while True:
            await self.refresh()
            await asyncio.sleep(_HEALTH_EVERY_S)


@dataclass(slots=True)
class Running:
    """A started picker: its gRPC and HTTP addresses, and what to stop."""

    app: web.Application
    picker: Picker
    grpc_port: int
    http_url: str
    health: Health
    _server: grpc.aio.Server
    _runner: web.AppRunner
    _health_task: asyncio.Task[None]

    async def drain(self, drain_s: float) -> int:
        """NOT_SERVING at once, new streams refused; open ones get up to drain_s to end.
        Returns the streams still open at the end (0: all finished)."""
        self.app[RUNTIME].draining = True
        await self.health.enter_graceful_shutdown()
        log.info("draining", streams=self.picker.streams, drain_s=drain_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.picker.idle.wait(), drain_s)
        return self.picker.streams

    async def stop(self, grace_s: float = 1.0) -> None:
        self._health_task.cancel()
        await self._server.stop(grace_s)
        await self._runner.cleanup()


async def start(
    config: Config,
    *,
    mode: Mode = Mode.POOL,
    host: str = "127.0.0.1",
    grpc_port: int = 0,
    http_port: int = 0,
    tokens: TokenCounter | None = None,
) -> Running:
    """Start the HTTP app (metrics, health) and the gRPC server; port 0: any free one."""
    app = create_app(config, tokens=tokens, forward=False)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, http_port))
    await web.SockSite(runner, sock).start()
    bound_http = sock.getsockname()[1]
    picker = Picker(app, mode)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
        ]
    )
    server.add_generic_rpc_handlers((picker.handler(),))
    health = Health(app)
    await health.set(SERVICE, _SERVING)
    await health.refresh()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    bound = server.add_insecure_port(f"{host}:{grpc_port}")
    await server.start()
    task = asyncio.create_task(health.watch_state())
    log.info("ext_proc_serving", host=host, grpc_port=bound, http_port=bound_http, mode=mode.value)
    url = f"http://{host}:{bound_http}"
    return Running(app, picker, bound, url, health, server, runner, task)


async def serve(config: Config, *, mode: Mode, host: str, grpc_port: int, http_port: int) -> None:
    """Run until SIGTERM/SIGINT: /ready turns 503 and the gRPC health NOT_SERVING, new
    streams are refused (Envoy fails open), open ones get drain_s to end."""
    running = await start(config, mode=mode, host=host, grpc_port=grpc_port, http_port=http_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        left = await running.drain(running.app[RUNTIME].current.config.server.drain_s)
        if left:
            log.warning("drain_timeout", streams=left)
        await running.stop(grace_s=0.5)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    log.info("stopped")
