"""A client that goes away cancels the upstream request (so vLLM aborts it).

Run against a real AppRunner with the production setting
(handler_cancellation=True, as `specroute serve` sets it), not only the test
server, and with a real upstream server that records its own cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from classifier.tokens import TokenCounter
from gateway.app import create_app
from tests.gateway.conftest import make_config
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_observability import samples
from tests.gateway.test_routing import post_hi
from tests.support import wait_until
from tooling.local_stack import serve_app


@pytest.fixture
async def production_gateway(
    spec_server: TestServer, base_server: TestServer, tokens: TokenCounter
) -> AsyncIterator[str]:
    config = make_config(str(spec_server.make_url("")), str(base_server.make_url("")))
    runner, url = await serve_app(create_app(config, tokens=tokens))  # handler cancellation on
    try:
        yield url
    finally:
        await runner.cleanup()


async def _disconnect_count(url: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as resp:
        m = samples(await resp.text())
    return sum(
        v
        for (name, labels), v in m.items()
        if name == "specroute_requests_total" and ("status", "client_disconnect") in labels
    )


async def _disconnect_counted(url: str) -> None:
    """Counted once the gateway's handler has unwound, a moment after the upstream's cancel."""
    counted = await wait_until(lambda: _disconnect_count(url), "a client_disconnect counted")
    assert counted == 1


async def test_disconnect_mid_stream_cancels_upstream(
    production_gateway: str, spec_upstream: FakeUpstream
) -> None:
    spec_upstream.chunk_delay_s = 0.5
    spec_upstream.words = ["tok"] * 40  # 20 s if nobody stopped it
    async with aiohttp.ClientSession() as session:
        resp = await post_hi(session, production_gateway, "speculative", stream=True)
        assert (await resp.content.readline()).startswith(b"data: ")
        resp.close()  # the client goes away mid-stream
        await asyncio.wait_for(spec_upstream.cancelled.wait(), timeout=1.0)
    assert not spec_upstream.sent_streams  # it never finished
    await _disconnect_counted(production_gateway)


async def test_disconnect_during_non_stream_request_cancels_upstream(
    production_gateway: str, base_upstream: FakeUpstream
) -> None:
    base_upstream.chunk_delay_s = 2.0  # a 12 s answer
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(post_hi(session, production_gateway, "baseline"))
        await asyncio.wait_for(base_upstream.arrived.wait(), timeout=5.0)
        task.cancel()  # closes the client's connection
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(base_upstream.cancelled.wait(), timeout=1.0)
    await _disconnect_counted(production_gateway)


async def test_disconnect_before_first_token_cancels_upstream(
    production_gateway: str, spec_upstream: FakeUpstream
) -> None:
    spec_upstream.chunk_delay_s = 3.0
    async with aiohttp.ClientSession() as session:
        resp = await post_hi(session, production_gateway, "speculative", stream=True)
        assert resp.status == 200  # headers only: no event has been produced yet
        resp.close()
        await asyncio.wait_for(spec_upstream.cancelled.wait(), timeout=1.0)
    await _disconnect_counted(production_gateway)
