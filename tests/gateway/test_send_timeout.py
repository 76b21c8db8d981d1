"""A client that stops reading does not hold its backend: after server.send_timeout_s
without progress the gateway hangs up, frees the slot and cancels the backend's request.

Before the fix a streaming client that never read held its slot (and its generation)
for as long as it kept the connection open. Run on a real AppRunner with the
production setting (handler cancellation on), with a raw client whose receive buffer
is small, against a backend that streams far more than the sockets can buffer.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from classifier.tokens import TokenCounter
from classifier.types import Route
from gateway.app import create_app
from gateway.state import BACKENDS
from tests.gateway.conftest import make_config
from tests.gateway.test_observability import samples
from tests.support import wait_until
from tooling.local_stack import serve_app

ServerFactory = Callable[[web.Application], Awaitable[TestServer]]
SEND_TIMEOUT_S = 0.5
# Generous: two busy cores. Without the fix the slot is held until the client leaves.
FREED_WITHIN_S = 10.0
# More than the sockets between the backend and the client can hold (the kernel's send
# buffer on loopback grows to 4 MiB), so a client that never reads blocks the gateway.
ANSWER_BYTES = 24 * 1024 * 1024
_TEXT = "x" * 4000


@dataclass
class Flood:
    """A backend whose answers are bigger than any socket buffer: a stream of 4 KB
    events, a whole answer of ANSWER_BYTES, or a passed-through read of as much.
    It records when each request ended, and whether it ran to its end."""

    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    completed: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)
        app.router.add_get("/flood", self._flood)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("stream"):
            return await self._flood(request)
        self.arrived.set()
        try:
            text = "x" * ANSWER_BYTES
            message = {"role": "assistant", "content": text}
            answer = {"object": "chat.completion", "choices": [{"index": 0, "message": message}]}
            return web.json_response(answer)
        finally:
            self.ended.set()

    async def _flood(self, request: web.Request) -> web.StreamResponse:
        self.arrived.set()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        try:
            await response.prepare(request)
            chunk = {"object": "chat.completion.chunk", "choices": [{"delta": {"content": _TEXT}}]}
            event = b"data: " + json.dumps(chunk).encode() + b"\n\n"
            for _ in range(ANSWER_BYTES // len(event)):
                await response.write(event)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            self.completed.append(request.path)
        finally:  # cancelled, or the connection reset under a write
            self.ended.set()
        return response


@pytest.fixture
async def flood_gateway(
    aiohttp_server: ServerFactory, tokens: TokenCounter
) -> AsyncIterator[tuple[Flood, web.Application, str]]:
    flood = Flood()
    url = str((await aiohttp_server(flood.app())).make_url(""))
    config = make_config(url, url, server={"send_timeout_s": SEND_TIMEOUT_S})
    app = create_app(config, tokens=tokens)
    runner, gateway = await serve_app(app)  # handler cancellation on, as in production
    try:
        yield flood, app, gateway
    finally:
        await runner.cleanup()


async def _never_reading(gateway: str, request: bytes) -> socket.socket:
    """A client that sends `request` and then reads nothing, with a small receive buffer."""
    host, port = gateway.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    await asyncio.get_running_loop().sock_sendall(sock, request)
    return sock


def _chat_request(stream: bool) -> bytes:
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        f"x-specroute-route: speculative\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _speculative_figures(gateway: str) -> tuple[float, float]:
    """The speculative route's client disconnects and requests in flight, as scraped."""
    async with aiohttp.ClientSession() as session, session.get(f"{gateway}/metrics") as resp:
        metrics = samples(await resp.text())
    disconnects = sum(
        v
        for (name, labels), v in metrics.items()
        if name == "specroute_requests_total"
        and {("route", "speculative"), ("status", "client_disconnect")} <= set(labels)
    )
    return disconnects, metrics[("specroute_inflight_requests", (("route", "speculative"),))]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_a_client_that_stops_reading_frees_its_slot(
    flood_gateway: tuple[Flood, web.Application, str], stream: bool
) -> None:
    flood, app, gateway = flood_gateway
    started = time.monotonic()
    with capture_logs() as logs:
        sock = await _never_reading(gateway, _chat_request(stream))
        try:
            await asyncio.wait_for(flood.arrived.wait(), timeout=FREED_WITHIN_S)
            backend = app[BACKENDS].of(Route("speculative"))
            assert backend.inflight == 1
            await wait_until(
                lambda: backend.inflight == 0, "the slot freed", timeout_s=FREED_WITHIN_S
            )
            await asyncio.wait_for(flood.ended.wait(), timeout=FREED_WITHIN_S)
        finally:
            sock.close()
    assert time.monotonic() - started < FREED_WITHIN_S
    assert flood.completed == []  # a stream was cut, not sent to its end
    (line,) = [e for e in logs if e["event"] == "request"]
    assert (line["status"], line["error"]) == ("client_disconnect", "client_send_timeout")
    assert await _speculative_figures(gateway) == (1, 0)


async def test_a_passed_through_read_to_a_client_that_stops_reading_is_cut(
    flood_gateway: tuple[Flood, web.Application, str],
) -> None:
    flood, _, gateway = flood_gateway
    with capture_logs() as logs:
        sock = await _never_reading(gateway, b"GET /flood HTTP/1.1\r\nHost: gw\r\n\r\n")
        try:
            await asyncio.wait_for(flood.ended.wait(), timeout=FREED_WITHIN_S)
        finally:
            sock.close()
    assert flood.completed == []
    assert [e["path"] for e in logs if e["event"] == "client_send_timeout"] == ["/flood"]
