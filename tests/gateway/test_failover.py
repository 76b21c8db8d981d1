"""Each backend is the other's fallback: failover, retry budget, ejection, admission, broken streams."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from classifier.tokens import TokenCounter
from classifier.types import Route
from gateway.app import create_app
from gateway.state import BACKENDS, SESSION
from tests.gateway.conftest import ClientFactory, GatewayFactory, make_config
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_observability import samples
from tests.gateway.test_routing import chat
from tests.support import wait_until

Client = TestClient[web.Request, web.Application]
SPEC = {"x-specroute-route": "speculative"}
STRUCTURED = chat("JSON please", temperature=0, response_format={"type": "json_object"})


async def gateway_with(
    aiohttp_client: ClientFactory,
    spec_url: str,
    base_url: str,
    tokens: TokenCounter,
    **sections: dict[str, Any],
) -> Client:
    return await aiohttp_client(
        create_app(make_config(spec_url, base_url, **sections), tokens=tokens)
    )


async def test_refused_connection_fails_over_to_the_other_backend(
    aiohttp_client: ClientFactory,
    unused_tcp_port: int,
    base_server: TestServer,
    base_upstream: FakeUpstream,
    tokens: TokenCounter,
) -> None:
    client = await gateway_with(
        aiohttp_client, f"http://127.0.0.1:{unused_tcp_port}", str(base_server.make_url("")), tokens
    )
    resp = await client.post("/v1/chat/completions", json=chat("hi", stream=True), headers=SPEC)
    assert resp.status == 200
    assert resp.headers["x-specroute-route"] == "baseline"
    assert resp.headers["x-specroute-failover"] == "speculative"
    assert (await resp.read()).endswith(b"data: [DONE]\n\n")
    m = samples(await (await client.get("/metrics")).text())
    assert (
        m[
            (
                "specroute_failovers_total",
                (("from_route", "speculative"), ("to_route", "baseline")),
            )
        ]
        == 1
    )
    assert (
        m[("specroute_upstream_errors_total", (("kind", "connect"), ("route", "speculative")))] == 1
    )
    assert (
        m[
            (
                "specroute_requests_total",
                (("route", "baseline"), ("status", "2xx"), ("workload", "chat")),
            )
        ]
        == 1
    )


async def test_5xx_before_any_byte_fails_over_and_4xx_does_not(
    gateway: Client, spec_upstream: FakeUpstream, base_upstream: FakeUpstream
) -> None:
    spec_upstream.fail_status = 503
    resp = await gateway.post("/v1/chat/completions", json=STRUCTURED)
    assert resp.status == 200 and resp.headers["x-specroute-route"] == "baseline"
    spec_upstream.fail_status = 400
    resp = await gateway.post("/v1/chat/completions", json=STRUCTURED)
    assert resp.status == 400 and resp.headers["x-specroute-route"] == "speculative"
    assert len(base_upstream.received) == 1


async def test_a_healthy_backend_takes_every_failover_whatever_the_budget(
    gateway_for: GatewayFactory,
    spec_upstream: FakeUpstream,
    base_upstream: FakeUpstream,
) -> None:
    """The budget stops storms onto a failing backend; it must not turn a healthy
    backend's capacity into 500s (before: 4 of 6 concurrent requests got 500)."""
    client = await gateway_for(
        upstream={"retry_budget_ratio": 0.0, "retry_budget_min": 0, "eject_after_failures": 100}
    )
    spec_upstream.fail_status = 500
    responses = await asyncio.gather(
        *(client.post("/v1/chat/completions", json=STRUCTURED) for _ in range(6))
    )
    assert [r.status for r in responses] == [200] * 6
    assert len(base_upstream.received) == 6


async def test_the_budget_bounds_retries_onto_a_backend_that_fails_too(
    gateway_for: GatewayFactory,
    spec_upstream: FakeUpstream,
    base_upstream: FakeUpstream,
) -> None:
    """Budget of 2 retries in flight: with both backends failing, of 6 concurrent
    failing requests exactly 2 are retried onto the other while those 2 are held
    (the baseline answers its failures only when the test lets it; before, an
    instant failure freed its slot and a loaded CI machine retried all 6)."""
    client = await gateway_for(
        upstream={"retry_budget_ratio": 0.0, "retry_budget_min": 2, "eject_after_failures": 100}
    )
    spec_upstream.fail_status = base_upstream.fail_status = 500
    forced = {"x-specroute-route": "baseline"}
    first = await client.post("/v1/chat/completions", json=chat("hi"), headers=forced)
    assert first.status == 500  # the baseline has failed: no longer proven
    before = len(base_upstream.received)
    base_upstream.fail_gate = gate = asyncio.Event()
    tasks = [
        asyncio.ensure_future(client.post("/v1/chat/completions", json=STRUCTURED))
        for _ in range(6)
    ]
    async with asyncio.timeout(10):
        for refused, next_done in enumerate(asyncio.as_completed(tasks), start=1):
            assert (await next_done).status == 500
            if refused == 4:  # the other 2 hold the budget at the gate
                break
    gate.set()
    responses = await asyncio.gather(*tasks)
    assert [r.status for r in responses] == [500] * 6
    assert len(base_upstream.received) - before == 2


async def test_passive_ejection_and_readmission(
    gateway_for: GatewayFactory,
    spec_upstream: FakeUpstream,
) -> None:
    client = await gateway_for(
        upstream={"eject_after_failures": 2, "eject_s": 0.5, "health_interval_s": 0.1}
    )
    pool = client.app[BACKENDS]
    spec_upstream.fail_status = 500  # its /health still says OK: only traffic shows the fault
    for _ in range(2):
        assert (await client.post("/v1/chat/completions", json=STRUCTURED)).status == 200
    assert not pool.live_state().of(Route.SPECULATIVE).healthy
    m = samples(await (await client.get("/metrics")).text())
    assert m[("specroute_backend_up", (("route", "speculative"),))] == 0
    resp = await client.post("/v1/chat/completions", json=STRUCTURED)
    assert resp.headers["x-specroute-reason"] == "unhealthy-fallback"
    assert (await (await client.get("/ready")).json())["backends"]["speculative"] is False

    spec_upstream.fail_status = None
    await wait_until(  # the 0.5 s ejection over, the next probe readmits it
        lambda: pool.live_state().of(Route.SPECULATIVE).healthy, "speculative readmitted"
    )
    resp = await client.post("/v1/chat/completions", json=STRUCTURED)
    assert resp.headers["x-specroute-route"] == "speculative"


async def test_the_last_healthy_backend_is_never_ejected(
    aiohttp_client: ClientFactory,
    spec_server: TestServer,
    unused_tcp_port: int,
    spec_upstream: FakeUpstream,
    tokens: TokenCounter,
) -> None:
    client = await gateway_with(
        aiohttp_client,
        str(spec_server.make_url("")),
        f"http://127.0.0.1:{unused_tcp_port}",
        tokens,
        upstream={"eject_after_failures": 1},
    )
    pool = client.app[BACKENDS]
    await pool.probe_all(client.app[SESSION], 1.0)
    assert not pool.live_state().of(Route.BASELINE).healthy
    spec_upstream.fail_status = 500
    for _ in range(3):
        await (await client.post("/v1/chat/completions", json=STRUCTURED)).read()
    assert pool.live_state().of(Route.SPECULATIVE).healthy
    assert (await client.get("/ready")).status == 200


async def test_admission_limit_fails_over_then_answers_429(
    gateway_for: GatewayFactory,
    spec_upstream: FakeUpstream,
    base_upstream: FakeUpstream,
) -> None:
    client = await gateway_for()
    for backend in client.app[BACKENDS]:
        backend.max_inflight = 1
    spec_upstream.chunk_delay_s = base_upstream.chunk_delay_s = 0.2
    first = asyncio.create_task(client.post("/v1/chat/completions", json=STRUCTURED))
    await asyncio.wait_for(spec_upstream.arrived.wait(), 5)
    second = asyncio.create_task(client.post("/v1/chat/completions", json=STRUCTURED))
    await asyncio.wait_for(base_upstream.arrived.wait(), 5)
    third = await client.post("/v1/chat/completions", json=STRUCTURED)
    assert third.status == 429
    assert third.headers["Retry-After"] == "1"
    assert (await third.json())["error"]["code"] == "overloaded"
    r1, r2 = await first, await second
    assert (r1.headers["x-specroute-route"], r2.headers["x-specroute-route"]) == (
        "speculative",
        "baseline",
    )
    assert r2.headers["x-specroute-failover"] == "speculative"


async def test_upstream_dying_mid_stream_ends_the_stream_with_an_error_event(
    gateway: Client, spec_upstream: FakeUpstream, base_upstream: FakeUpstream
) -> None:
    spec_upstream.drop_after = 3
    resp = await gateway.post("/v1/chat/completions", json=chat("hi", stream=True), headers=SPEC)
    body = await resp.read()
    events = [e for e in body.split(b"\n\n") if e]
    assert len(events) == 5  # 3 relayed, the error, [DONE]
    error = json.loads(events[3][len(b"data: ") :])["error"]
    assert error["code"] == "upstream_broken"
    assert events[4] == b"data: [DONE]"
    assert not base_upstream.received  # bytes were sent: no retry
    m = samples(await (await gateway.get("/metrics")).text())
    assert (
        m[
            (
                "specroute_upstream_errors_total",
                (("kind", "upstream_broken"), ("route", "speculative")),
            )
        ]
        == 1
    )
    assert (
        m[
            (
                "specroute_requests_total",
                (("route", "speculative"), ("status", "stream_error"), ("workload", "chat")),
            )
        ]
        == 1
    )


async def test_an_error_event_from_vllm_mid_stream_is_a_failed_request(
    gateway: Client, spec_upstream: FakeUpstream, base_upstream: FakeUpstream
) -> None:
    """vLLM ends a stream that fails after its status went out with an error event
    and [DONE]. The client gets it as vLLM sent it; the gateway must not log the
    request as a success (the real CPU pair did this to JSON-schema requests)."""
    spec_upstream.error_after = 3
    resp = await gateway.post("/v1/chat/completions", json=chat("hi", stream=True), headers=SPEC)
    events = [e for e in (await resp.read()).split(b"\n\n") if e]
    assert len(events) == 5  # 3 relayed, vLLM's error, [DONE]
    assert json.loads(events[3][len(b"data: ") :])["error"]["code"] == 500
    assert events[4] == b"data: [DONE]"
    assert not base_upstream.received  # bytes were sent: no retry
    m = samples(await (await gateway.get("/metrics")).text())
    kind = (("kind", "upstream_error_event"), ("route", "speculative"))
    assert m[("specroute_upstream_errors_total", kind)] == 1
    status = (("route", "speculative"), ("status", "stream_error"), ("workload", "chat"))
    assert m[("specroute_requests_total", status)] == 1


async def test_stalled_stream_is_cut_by_the_read_timeout(
    gateway_for: GatewayFactory,
    spec_upstream: FakeUpstream,
) -> None:
    client = await gateway_for(upstream={"read_timeout_s": 0.3})
    spec_upstream.stall_after = 2
    resp = await client.post("/v1/chat/completions", json=chat("hi", stream=True), headers=SPEC)
    events = [e for e in (await resp.read()).split(b"\n\n") if e]
    assert json.loads(events[2][len(b"data: ") :])["error"]["code"] == "upstream_stall"
    assert events[-1] == b"data: [DONE]"
