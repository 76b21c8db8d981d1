"""The Envoy bootstrap's failure modes, as deploy/envoy/envoy.yaml states them, and the
picker's accounting through each: a client that goes away, a server that fails before
a byte, one that breaks or dies mid-answer, and the picker itself down, draining or
slower than message_timeout (fail open)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from gateway.extproc.stream import PickerStream
from tests.extproc.conftest import Stack, StackFactory
from tests.support import wait_until
from tooling.envoy import chat, emulator_state, envoy_stat, metric

SLOW_PROBES = {"health_interval_s": 30.0, "scrape_interval_s": 30.0}  # Envoy notices first


async def _faults(url: str, **faults: object) -> None:
    async with aiohttp.ClientSession() as s, s.post(f"{url}/emulator/faults", json=faults) as r:
        assert r.status == 200


async def _settled(stack: Stack) -> None:
    picker = stack.picker.http_url
    await wait_until(
        lambda: _zero(picker), "the picker's in-flight count back to zero", timeout_s=5
    )
    await wait_until(
        lambda: stack.picker.picker.streams == 0, "every gRPC stream closed", timeout_s=5
    )


async def _zero(picker: str) -> bool:
    return await metric(picker, "specroute_inflight_requests") == 0


async def test_a_client_that_goes_away_releases_its_count_and_the_server_aborts(
    stack_for: StackFactory,
) -> None:
    stack = await stack_for()
    long = chat(stream=True, max_tokens=4000, min_tokens=4000, ignore_eos=True)
    async with aiohttp.ClientSession() as s:
        r = await s.post(f"{stack.envoy.url}/v1/chat/completions", json=long)
        await r.content.readline()
        r.close()  # the client leaves mid-stream
    await _settled(stack)
    picker = stack.picker.http_url
    assert await metric(picker, "specroute_requests_total", status="stream_reset") == 1
    # even then Envoy half-closes the gRPC stream (graceful close), no reset
    assert await metric(picker, "specroute_extproc_streams_total", end="closed") == 1
    assert await metric(picker, "specroute_extproc_streams_total", end="cancelled") == 0
    state = await wait_until(
        lambda: _aborted(stack.spec_url), "the server aborted the generation", timeout_s=5
    )
    assert state is not None and state["running"] == 0


async def _aborted(url: str) -> dict[str, object] | None:
    state = await emulator_state(url)
    return state if state["client_aborts"] == 1 else None


@pytest.mark.parametrize("stream", [False, True])
async def test_a_5xx_before_any_byte_is_retried_on_the_other_route(
    stack_for: StackFactory, stream: bool
) -> None:
    stack = await stack_for(upstream=SLOW_PROBES)
    await _faults(stack.spec_url, fail_status=503, fault_limit=1)
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{stack.envoy.url}/v1/chat/completions", json=chat(stream=stream)) as r,
    ):
        assert r.status == 200
        assert r.headers["x-specroute-route"] == "baseline"  # who answered
        assert r.headers["x-specroute-failover"] == "speculative"  # who was chosen
        await r.read()
    await _settled(stack)
    picker = stack.picker.http_url
    assert await metric(picker, "specroute_failovers_total", from_route="speculative") == 1
    assert await metric(picker, "specroute_requests_total", route="baseline", status="2xx") == 1
    assert await envoy_stat(stack.envoy.admin, "cluster.speculative.upstream_rq_retry") == 1


async def test_a_dead_server_is_failed_over_to_and_ejected(stack_for: StackFactory) -> None:
    """Killed between requests: refused connections, retried on the other route, then
    Envoy's health checks and outlier detection keep the traffic there."""
    stack = await stack_for(upstream=SLOW_PROBES)
    await stack.kill("speculative")
    async with aiohttp.ClientSession() as s:
        for _ in range(5):
            async with s.post(f"{stack.envoy.url}/v1/chat/completions", json=chat()) as r:
                assert r.status == 200
                assert r.headers["x-specroute-route"] == "baseline"
                assert r.headers["x-specroute-failover"] == "speculative"
    await _settled(stack)
    assert await metric(stack.picker.http_url, "specroute_requests_total", status="2xx") == 5
    assert (await emulator_state(stack.base_url))["submitted"] == 5


async def test_a_server_killed_mid_stream(stack_for: StackFactory) -> None:
    """The answer had started: nothing can be retried; the client's stream ends early,
    the picker releases the count and does not learn from it; the next request is
    answered by the other route."""
    stack = await stack_for(upstream=SLOW_PROBES)
    long = chat(stream=True, max_tokens=4000, min_tokens=4000, ignore_eos=True)
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{stack.envoy.url}/v1/chat/completions", json=long) as r:
            assert r.headers["x-specroute-route"] == "speculative"
            await r.content.readline()
            await stack.kill("speculative")
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
        await _settled(stack)
        picker = stack.picker.http_url
        assert await metric(picker, "specroute_requests_total", status="stream_reset") == 1
        assert await metric(picker, "specroute_output_tokens_total") == 0  # nothing learned
        async with s.post(f"{stack.envoy.url}/v1/chat/completions", json=chat()) as r:
            assert r.status == 200
            assert r.headers["x-specroute-route"] == "baseline"


async def test_a_stream_the_server_drops_is_no_lesson(stack_for: StackFactory) -> None:
    stack = await stack_for(upstream=SLOW_PROBES)
    await _faults(stack.spec_url, drop_after_chunks=3, fault_limit=1)
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{stack.envoy.url}/v1/chat/completions", json=chat(stream=True)) as r,
    ):
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
    await _settled(stack)
    picker = stack.picker.http_url
    assert await metric(picker, "specroute_requests_total", status="stream_reset") == 1
    assert await metric(picker, "specroute_requests_total", status="2xx") == 0


async def test_picker_down_fails_open_to_the_default_route(stack_for: StackFactory) -> None:
    stack = await stack_for(picker_up=False)
    async with aiohttp.ClientSession() as s:
        for stream in (False, True):
            async with s.post(
                f"{stack.envoy.url}/v1/chat/completions", json=chat(stream=stream)
            ) as r:
                assert r.status == 200
                assert "x-specroute-route" not in r.headers  # nobody decided
                await r.read()
    assert (await emulator_state(stack.base_url))["submitted"] == 2
    assert (await emulator_state(stack.spec_url))["submitted"] == 0
    admin = stack.envoy.admin
    assert await envoy_stat(admin, "http.specroute.ext_proc.failure_mode_allowed") >= 2


async def test_picker_stopped_mid_run_fails_open(stack_for: StackFactory) -> None:
    stack = await stack_for()
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{stack.envoy.url}/v1/chat/completions", json=chat()) as r:
            assert r.headers["x-specroute-route"] == "speculative"
        await stack.picker.stop(grace_s=0)
        await asyncio.sleep(0.1)
        async with s.post(f"{stack.envoy.url}/v1/chat/completions", json=chat()) as r:
            assert r.status == 200
            assert "x-specroute-route" not in r.headers
    assert (await emulator_state(stack.base_url))["submitted"] == 1


async def test_a_draining_picker_is_taken_out_and_new_requests_fail_open(
    stack_for: StackFactory,
) -> None:
    """Its gRPC health turns NOT_SERVING: Envoy's grpc_health_check takes it out of the
    picker cluster, new requests go on unrouted to the default route, and the stream
    already open keeps its picker to the end."""
    stack = await stack_for()
    admin = stack.envoy.admin
    assert await envoy_stat(admin, "cluster.specroute_picker.membership_healthy") == 1
    long = chat(stream=True, max_tokens=4000, min_tokens=4000, ignore_eos=True)
    async with aiohttp.ClientSession() as s:
        r = await s.post(f"{stack.envoy.url}/v1/chat/completions", json=long)
        assert r.headers["x-specroute-route"] == "speculative"
        await r.content.readline()
        drained = asyncio.create_task(stack.picker.drain(drain_s=30))

        async def out() -> bool:
            return await envoy_stat(admin, "cluster.specroute_picker.membership_healthy") == 0

        await wait_until(out, "Envoy's health check took the picker out", timeout_s=10)
        async with s.post(f"{stack.envoy.url}/v1/chat/completions", json=chat()) as fresh:
            assert fresh.status == 200
            assert "x-specroute-route" not in fresh.headers  # nobody decided: fail open
        assert await r.content.readline()  # the open stream still flows
        assert not drained.done()
        r.close()  # it ends (here: the client leaves); the drain is over
        assert await asyncio.wait_for(drained, 10) == 0
    assert (await emulator_state(stack.base_url))["submitted"] == 1
    assert await envoy_stat(admin, "cluster.specroute_picker.health_check.failure") >= 1


async def test_a_picker_slower_than_message_timeout_fails_open(
    stack_for: StackFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped message_timeout (1 s) decides: a decision that takes longer is given
    up on, the request goes on unrouted to the default route, and the late picker's
    stream is closed by Envoy and frees its count."""
    stack = await stack_for()
    slow = asyncio.Event()
    decide = PickerStream._decide

    async def late(self: PickerStream, life: Any, raw: bytes) -> Any:
        if slow.is_set():
            await asyncio.sleep(1.5)  # a picker stuck behind a flood
        return await decide(self, life, raw)

    monkeypatch.setattr(PickerStream, "_decide", late)
    admin = stack.envoy.admin
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{stack.envoy.url}/v1/chat/completions", json=chat()) as r:
            assert r.headers["x-specroute-route"] == "speculative"  # in time: decided
        slow.set()
        for stream in (False, True):
            started = asyncio.get_running_loop().time()
            async with s.post(
                f"{stack.envoy.url}/v1/chat/completions", json=chat(stream=stream)
            ) as r:
                assert r.status == 200
                assert "x-specroute-route" not in r.headers  # nobody decided in time
                await r.read()
            assert asyncio.get_running_loop().time() - started < 1.5  # Envoy did not wait
    await _settled(stack)
    assert await envoy_stat(admin, "http.specroute.ext_proc.message_timeouts") == 2
    assert await envoy_stat(admin, "http.specroute.ext_proc.failure_mode_allowed") == 2
    assert (await emulator_state(stack.base_url))["submitted"] == 2
