"""A stream's prompt counts as pending prefill on its backend until its first token comes
back: the cost model charges a new request for the prompts queued ahead of it."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient

from classifier.types import BackendState, Route
from gateway.state import BACKENDS
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.support import wait_until

PROMPT = "Summarise the following report in three sentences. " * 20


def body(stream: bool) -> dict[str, Any]:
    return {
        "model": "fake-model",
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": stream,
        "temperature": 0,
    }


def baseline(gateway: TestClient[web.Request, web.Application]) -> BackendState:
    return gateway.app[BACKENDS].live_state().of(Route.BASELINE)


async def stalled_stream(
    gateway_for: GatewayFactory, upstream: FakeUpstream, events: int
) -> tuple[TestClient[web.Request, web.Application], ClientResponse]:
    """A stream to the baseline whose upstream goes silent after `events` events."""
    upstream.stall_after = events
    gateway = await gateway_for()
    headers = {"x-specroute-route": "baseline"}
    resp = await gateway.post("/v1/chat/completions", json=body(True), headers=headers)
    assert b'"role"' in await resp.content.readuntil(b"\n\n")  # no token in it
    return gateway, resp


async def close_and_check_released(
    gateway: TestClient[web.Request, web.Application], resp: ClientResponse
) -> None:
    resp.close()
    # The gateway's bookkeeping ends in a handler we do not await.
    await wait_until(lambda: baseline(gateway).inflight == 0, "the closed stream released")
    assert baseline(gateway).prefill_tokens == 0


async def test_counted_until_the_first_token(
    gateway_for: GatewayFactory, base_upstream: FakeUpstream
) -> None:
    gateway, resp = await stalled_stream(gateway_for, base_upstream, 1)
    pending = baseline(gateway).prefill_tokens
    assert 150 < pending < 300  # the prompt's token count, as the gateway counts it
    metrics = await (await gateway.get("/metrics")).text()
    assert f'specroute_prefill_pending_tokens{{route="baseline"}} {pending}.0' in metrics
    assert 'specroute_prefill_pending_tokens{route="speculative"} 0.0' in metrics
    await close_and_check_released(gateway, resp)  # no token ever: released at the end


async def test_not_counted_once_a_token_came_back(
    gateway_for: GatewayFactory, base_upstream: FakeUpstream
) -> None:
    gateway, resp = await stalled_stream(gateway_for, base_upstream, 2)
    assert b"Hello" in await resp.content.readuntil(b"\n\n")
    state = baseline(gateway)
    assert (state.inflight, state.prefill_tokens) == (1, 0)  # the stream goes on
    await close_and_check_released(gateway, resp)


async def test_a_non_streamed_request_is_not_counted(
    gateway_for: GatewayFactory, base_upstream: FakeUpstream
) -> None:
    base_upstream.chunk_delay_s = 0.1
    gateway = await gateway_for()
    headers = {"x-specroute-route": "baseline"}
    task = asyncio.create_task(
        gateway.post("/v1/chat/completions", json=body(False), headers=headers)
    )
    await asyncio.wait_for(base_upstream.arrived.wait(), 5)
    state = baseline(gateway)
    assert (state.inflight, state.prefill_tokens) == (1, 0)
    resp = await task
    assert resp.status == 200
    await resp.read()
