"""Endpoint mode: GIE's endpoint-picker protocol under a real Envoy, with GIE's
processing modes (FULL_DUPLEX_STREAMED both ways) and an ORIGINAL_DST cluster."""

from __future__ import annotations

import json

import aiohttp

from gateway.extproc.stream import Mode
from tests.extproc.conftest import StackFactory
from tests.extproc.helpers import events, usage_chunks
from tooling.envoy import chat, emulator_state, metric


async def test_the_named_server_answers_streamed_and_not(stack_for: StackFactory) -> None:
    stack = await stack_for(mode=Mode.ENDPOINT)
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{stack.envoy.url}/v1/chat/completions", json=chat()) as r:
            assert r.status == 200
            assert r.headers["x-specroute-route"] == "speculative"
            whole = await r.json()
        hot = chat(stream=True, temperature=1.5)
        async with s.post(f"{stack.envoy.url}/v1/chat/completions", json=hot) as r:
            assert (r.headers["x-specroute-route"], r.headers["x-specroute-reason"]) == (
                "baseline",
                "high-temperature",
            )
            streamed = await r.text()
    assert whole["usage"]["completion_tokens"] == 16
    assert usage_chunks(streamed) == [] and events(streamed)[-1] == "[DONE]"
    assert "".join(
        json.loads(e)["choices"][0]["delta"].get("content", "") for e in events(streamed)[:-1]
    )
    assert (await emulator_state(stack.spec_url))["submitted"] == 1
    assert (await emulator_state(stack.base_url))["submitted"] == 1
    picker = stack.picker.http_url
    assert await metric(picker, "specroute_output_tokens_total") == 32
    assert await metric(picker, "specroute_requests_total", status="2xx") == 2


async def test_a_big_body_passes_in_pieces(stack_for: StackFactory) -> None:
    """A body over Envoy's 64 KiB chunks reaches the server whole after the picker held it."""
    stack = await stack_for(mode=Mode.ENDPOINT)
    big = chat("word " * 60_000, max_tokens=4)  # 300 kB: five of Envoy's chunks
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{stack.envoy.url}/v1/chat/completions", json=big) as r,
    ):
        # The server's own answer (the emulated context is 8k tokens), counting
        # every token of the body: it arrived whole.
        assert r.status == 400
        assert r.headers["x-specroute-reason"] == "prefill-bound"
        assert "60009 input tokens" in (await r.json())["error"]["message"]
    assert await metric(stack.picker.http_url, "specroute_requests_total", status="4xx") == 1


async def test_bad_input_is_refused_in_openai_shape(stack_for: StackFactory) -> None:
    stack = await stack_for(mode=Mode.ENDPOINT)
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{stack.envoy.url}/v1/chat/completions",
            data=b"{not json",
            headers={"content-type": "application/json"},
        ) as r,
    ):
        assert r.status == 400
        assert (await r.json())["error"]["type"] == "invalid_request_error"
    assert (await emulator_state(stack.spec_url))["submitted"] == 0
