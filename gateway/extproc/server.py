"""`specroute ext-proc`: the picker process. A gRPC ExternalProcessor for Envoy, and
beside it the gateway's own app without its forwarding routes (create_app with
forward=False) on an HTTP port: /metrics, /health, /ready, /stats, /decide.

Both run on one event loop and share one app's state: the backends' health
probes and scrapes, the profile, the policy, the metrics registry, the shadow
copies, the outcome log. Only the transport differs from `specroute serve`:
Envoy carries the bytes, the picker decides and reads them as they pass.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from aiohttp import web

from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.config import Config
from gateway.extproc.pb import ext_proc_subset_pb2 as pb
from gateway.extproc.stream import Mode, PickerStream
from gateway.state import BACKENDS, RUNTIME

log = structlog.get_logger("specroute.extproc")
SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
_MAX_MESSAGE = 16 * 1024 * 1024  # a buffered body arrives in one message


class Picker:
    """The ExternalProcessor service: one PickerStream per gRPC stream (per request)."""

    def __init__(self, app: web.Application, mode: Mode) -> None:
        self.app, self.mode = app, mode
        self.streams = 0  # open now: each holds its request's in-flight count

    async def process(
        self, requests: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> AsyncIterator[pb.ProcessingResponse]:
        stream = PickerStream(self.app, self.mode)
        self.streams += 1
        try:
            async for message in requests:
                for reply in await stream.on(message):
                    yield reply
        finally:  # a reset stream (client gone) ends here too, cancelled
            self.streams -= 1
            stream.close()

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.stream_stream_rpc_method_handler(
            self.process,
            request_deserializer=pb.ProcessingRequest.FromString,
            response_serializer=pb.ProcessingResponse.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(SERVICE, {"Process": method})


@dataclass(slots=True)
class Running:
    """A started picker: its gRPC and HTTP addresses, and what to stop."""

    app: web.Application
    picker: Picker
    grpc_port: int
    http_url: str
    _server: grpc.aio.Server
    _runner: web.AppRunner

    async def stop(self, grace_s: float = 1.0) -> None:
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
    bound = server.add_insecure_port(f"{host}:{grpc_port}")
    await server.start()
    log.info("ext_proc_serving", host=host, grpc_port=bound, http_port=bound_http, mode=mode.value)
    return Running(app, picker, bound, f"http://{host}:{bound_http}", server, runner)


async def serve(config: Config, *, mode: Mode, host: str, grpc_port: int, http_port: int) -> None:
    """Run until SIGTERM/SIGINT: /ready turns 503, open streams get drain_s to end."""
    running = await start(config, mode=mode, host=host, grpc_port=grpc_port, http_port=http_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        running.app[RUNTIME].draining = True
        drain_s = running.app[RUNTIME].current.config.server.drain_s
        log.info("draining", inflight=running.app[BACKENDS].inflight, drain_s=drain_s)
        await running.stop(grace_s=drain_s)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    log.info("stopped")
