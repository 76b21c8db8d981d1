"""What one request costs the gateway (issue 53): the loop it runs on, the writes it makes.

Measured in docs/benchmarks.md ("Where a request's CPU goes"); these tests pin the
choices that the measurement paid for, on real servers on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

import pytest
import uvloop
from aiohttp import web
from aiohttp.test_utils import TestClient

from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.config import Config
from gateway.serve import run

ClientFactory = Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_the_gateway_runs_on_uvloop() -> None:
    """`specroute serve` runs its coroutine on uvloop (gateway/cli.py calls run)."""
    loops: list[type[asyncio.AbstractEventLoop]] = []

    async def main() -> None:
        loops.append(type(asyncio.get_running_loop()))

    run(main())
    assert loops == [uvloop.Loop]


async def test_a_whole_answer_leaves_in_one_write(
    aiohttp_client: ClientFactory,
    config: Config,
    tokens: TokenCounter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A non-streamed answer's status line, headers and body reach the socket in one
    write: one syscall, not a second one for the headers alone."""
    writes: list[bytes] = []

    @web.middleware
    async def count_writes(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        assert transport is not None
        write, writelines = transport.write, transport.writelines

        def one(data: bytes | bytearray | memoryview) -> None:
            writes.append(bytes(data))
            write(data)

        def many(parts: Iterable[bytes | bytearray | memoryview]) -> None:
            parts = list(parts)
            writes.append(b"".join(parts))
            writelines(parts)

        monkeypatch.setattr(transport, "write", one)
        monkeypatch.setattr(transport, "writelines", many)
        return await handler(request)

    app = create_app(config, tokens=tokens)
    app.middlewares.append(count_writes)  # innermost: around the handler's own writes
    client = await aiohttp_client(app)
    async with client.post("/v1/chat/completions", json=CHAT) as resp:
        body = await resp.read()
    assert resp.status == 200, body
    assert len(writes) == 1, writes
    assert writes[0].startswith(b"HTTP/1.1 200 ") and writes[0].endswith(body)
