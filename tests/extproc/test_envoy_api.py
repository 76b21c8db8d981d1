"""The standalone gateway's API contract, through a real Envoy and `specroute ext-proc`
(pool mode) over the emulated pair: the same answers, headers and learning as `serve`."""

from __future__ import annotations

import json

import aiohttp

from tests.extproc.conftest import StackFactory
from tests.extproc.helpers import events, usage_chunks
from tests.support import wait_until
from tooling.envoy import chat, emulator_state, metric
from tooling.local_stack import MODEL


async def test_a_whole_answer_carries_the_decision_and_is_learned(stack_for: StackFactory) -> None:
    stack = await stack_for()
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{stack.envoy.url}/v1/chat/completions", json=chat()) as r,
    ):
        assert r.status == 200
        assert r.headers["x-specroute-route"] == "speculative"
        assert r.headers["x-specroute-reason"] == "default"
        request_id = r.headers["x-request-id"]
        body = await r.json()
    assert body["usage"]["completion_tokens"] == 16
    # The speculative emulator answered: only it reports per-request speculative metrics.
    assert body["metrics"]["speculative_decoding"]["num_draft_tokens"] > 0
    picker = stack.picker.http_url
    assert await metric(picker, "specroute_requests_total", route="speculative", status="2xx") == 1
    assert await metric(picker, "specroute_output_tokens_total", route="speculative") == 16
    assert (
        await metric(picker, "specroute_spec_acceptance_ratio_count", source="per_request_metrics")
        == 1
    )
    assert request_id and body["id"].endswith(request_id)  # the id Envoy and the picker log


async def test_a_stream_loses_only_the_usage_chunk_the_picker_asked_for(
    stack_for: StackFactory,
) -> None:
    stack = await stack_for()
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{stack.envoy.url}/v1/chat/completions", json=chat(stream=True)) as r:
            assert r.status == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["x-specroute-route"] == "speculative"
            plain = await r.text()
        asked = chat(stream=True, stream_options={"include_usage": True})
        async with s.post(f"{stack.envoy.url}/v1/chat/completions", json=asked) as r:
            with_usage = await r.text()
    assert events(plain)[-1] == "[DONE]"
    assert usage_chunks(plain) == []  # added by the picker, cut again on the way back
    assert [c["usage"]["completion_tokens"] for c in usage_chunks(with_usage)] == [16]
    text = "".join(
        json.loads(e)["choices"][0]["delta"].get("content", "") for e in events(plain)[:-1]
    )
    assert text  # the tokens themselves passed
    picker = stack.picker.http_url
    # Both streams were measured: tokens from the usage the client never saw, and a TTFT.
    assert await metric(picker, "specroute_output_tokens_total", route="speculative") == 32
    assert await metric(picker, "specroute_time_to_first_token_seconds_count") == 2


async def test_completions_streamed_and_not(stack_for: StackFactory) -> None:
    stack = await stack_for()
    body = {"model": MODEL, "prompt": "SELECT", "max_tokens": 8, "temperature": 1.5}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{stack.envoy.url}/v1/completions", json=body) as r:
            assert r.status == 200
            assert (r.headers["x-specroute-route"], r.headers["x-specroute-reason"]) == (
                "baseline",
                "high-temperature",
            )
            whole = await r.json()
        async with s.post(f"{stack.envoy.url}/v1/completions", json={**body, "stream": True}) as r:
            assert r.headers["x-specroute-route"] == "baseline"
            streamed = await r.text()
    assert whole["usage"]["completion_tokens"] == 8
    assert "speculative_decoding" not in json.dumps(whole)  # the baseline emulator answered
    assert usage_chunks(streamed) == [] and events(streamed)[-1] == "[DONE]"
    assert (
        await metric(stack.picker.http_url, "specroute_output_tokens_total", route="baseline") == 16
    )


async def test_the_override_header_picks_the_route(stack_for: StackFactory) -> None:
    stack = await stack_for()
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{stack.envoy.url}/v1/chat/completions",
            json=chat(),
            headers={"x-specroute-route": "baseline"},
        ) as r,
    ):
        assert (r.headers["x-specroute-route"], r.headers["x-specroute-reason"]) == (
            "baseline",
            "override",
        )
        assert r.status == 200
    assert (await emulator_state(stack.base_url))["submitted"] == 1
    assert (await emulator_state(stack.spec_url))["submitted"] == 0


async def test_unrouted_paths_pass_to_the_default_route(stack_for: StackFactory) -> None:
    stack = await stack_for()
    async with aiohttp.ClientSession() as s, s.get(f"{stack.envoy.url}/v1/models") as r:
        assert r.status == 200
        assert [m["id"] for m in (await r.json())["data"]] == [MODEL]
        assert "x-specroute-route" not in r.headers
    assert await metric(stack.picker.http_url, "specroute_requests_total") == 0


async def test_in_flight_follows_the_streams_and_returns_to_zero(stack_for: StackFactory) -> None:
    stack = await stack_for()
    picker = stack.picker.http_url
    long = chat(stream=True, max_tokens=400)
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{stack.envoy.url}/v1/chat/completions", json=long) as r:
            await r.content.readline()
            assert await metric(picker, "specroute_inflight_requests", route="speculative") == 1
            await r.read()
        await wait_until(lambda: _inflight(picker), "in-flight back to zero", timeout_s=5)
    # Envoy closes the gRPC stream once the HTTP stream is done: a half-close, not a
    # reset (the bootstrap's ext_proc_graceful_grpc_close; a reset leaks in grpcio).
    await wait_until(
        lambda: stack.picker.picker.streams == 0, "the gRPC stream closed", timeout_s=5
    )
    assert await metric(picker, "specroute_requests_total", status="2xx") == 1
    assert await metric(picker, "specroute_extproc_streams_total", end="closed") == 1
    assert await metric(picker, "specroute_extproc_streams_total", end="cancelled") == 0


async def _inflight(picker: str) -> bool:
    return await metric(picker, "specroute_inflight_requests") == 0
