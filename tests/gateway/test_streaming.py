"""Streams pass through byte for byte; the usage chunk the gateway asked for is removed."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from classifier.tokens import TokenCounter
from gateway.app import create_app
from tests.gateway.conftest import ClientFactory, RawUpstreams, ServerFactory, make_config
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.misbehaving_upstream import UNWRITABLE_IDS, UNWRITABLE_MEMBERS
from tests.gateway.test_routing import chat
from tooling.emulator import EmulatorConfig, create_emulator_app

Client = TestClient[web.Request, web.Application]
SPEC = {"x-specroute-route": "speculative"}
CONTINUOUS_ONLY = {"continuous_usage_stats": True}  # and no include_usage


async def test_stream_with_usage_requested_is_byte_identical(
    gateway: Client, spec_upstream: FakeUpstream
) -> None:
    body = chat("hi", stream=True, stream_options={"include_usage": True})
    resp = await gateway.post("/v1/chat/completions", json=body, headers=SPEC)
    assert resp.status == 200
    assert resp.content_type == "text/event-stream"
    received = await resp.read()
    assert received == spec_upstream.sent_streams[0]
    assert spec_upstream.received == [body]  # nothing added: the client asked already


async def test_stream_without_usage_hides_the_usage_the_gateway_asked_for(
    gateway: Client, spec_upstream: FakeUpstream
) -> None:
    body = chat("hi", stream=True)
    resp = await gateway.post("/v1/chat/completions", json=body, headers=SPEC)
    received = await resp.read()
    forwarded = spec_upstream.received[0]
    assert forwarded["stream_options"] == {"include_usage": True}
    assert {k: v for k, v in forwarded.items() if k != "stream_options"} == body
    upstream_events = spec_upstream.sent_streams[0].split(b"\n\n")
    usage_events = [e for e in upstream_events if b'"usage"' in e]
    assert len(usage_events) == 1
    expected = b"\n\n".join(e for e in upstream_events if e not in usage_events)
    assert received == expected
    assert b'"usage"' not in received
    assert received.endswith(b"data: [DONE]\n\n")


async def test_stream_keeps_other_stream_options(
    gateway: Client, spec_upstream: FakeUpstream
) -> None:
    body = chat("hi", stream=True, stream_options={"continuous_usage_stats": False})
    await (await gateway.post("/v1/chat/completions", json=body, headers=SPEC)).read()
    assert spec_upstream.received[0]["stream_options"] == {
        "continuous_usage_stats": False,
        "include_usage": True,
    }


async def test_completions_stream_passthrough(gateway: Client, spec_upstream: FakeUpstream) -> None:
    body = {"prompt": "def add(a, b):", "stream": True, "temperature": 0}
    resp = await gateway.post("/v1/completions", json=body, headers=SPEC)
    text = ""
    async for line in resp.content:
        if line.startswith(b"data: {"):
            text += json.loads(line[6:])["choices"][0]["text"]
    assert text == "Hello from the fake upstream."


async def test_chunks_arrive_as_they_are_produced(
    gateway: Client, spec_upstream: FakeUpstream
) -> None:
    """A relay that buffered the whole answer would deliver everything at the end."""
    spec_upstream.chunk_delay_s = 0.2
    resp = await gateway.post("/v1/chat/completions", json=chat("hi", stream=True), headers=SPEC)
    first = await resp.content.readline()
    assert first.startswith(b"data: ")
    assert not spec_upstream.sent_streams  # the upstream is still producing
    await resp.read()


@pytest.mark.parametrize(
    "extra",
    UNWRITABLE_MEMBERS,
    ids=UNWRITABLE_IDS,
)
async def test_a_stream_asks_for_usage_without_rewriting_the_body(
    aiohttp_client: ClientFactory,
    raw_upstreams: RawUpstreams,
    tokens: TokenCounter,
    extra: bytes,
) -> None:
    """The body goes out as the client wrote it, with the gateway's stream_options
    after it: the last of two same-named members is the one a JSON parser keeps."""
    spec, base = raw_upstreams
    gateway = await aiohttp_client(create_app(make_config(spec.url, base.url), tokens=tokens))
    sent = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,' + extra + b"}"
    headers = {**SPEC, "Content-Type": "application/json"}
    resp = await gateway.post("/v1/chat/completions", data=sent, headers=headers)
    assert resp.status == 200
    events = [e for e in (await resp.read()).split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and not any(b'"usage"' in e for e in events)
    (received,) = spec.received
    assert received.body == sent[:-1] + b',"stream_options":{"include_usage":true}}'


def _events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for event in raw.split(b"\n\n"):
        if event.startswith(b"data: {"):
            out.append(json.loads(event[6:]))
    return out


async def test_continuous_usage_without_include_usage_reaches_client_as_direct(
    aiohttp_server: ServerFactory, aiohttp_client: ClientFactory, tokens: TokenCounter
) -> None:
    """vLLM sends usage per event only when include_usage is set too; through the
    gateway (which adds include_usage for itself) the client must still get none."""
    emulated = EmulatorConfig(mode="speculative", time_scale=0.02, seed=3)
    server = await aiohttp_server(create_emulator_app(emulated))
    url = str(server.make_url(""))
    gateway = await aiohttp_client(create_app(make_config(url, url), tokens=tokens))
    body = {
        "model": "smollm2-135m",
        "messages": [{"role": "user", "content": "Count to twenty."}],
        "max_tokens": 24,
        "stream": True,
        "stream_options": CONTINUOUS_ONLY,
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/chat/completions", json=body) as resp,
    ):
        direct = _events(await resp.read())
    through = _events(await (await gateway.post("/v1/chat/completions", json=body)).read())

    assert direct and through
    assert [e for e in direct if "usage" in e] == []
    assert [e for e in through if "usage" in e] == []
    assert [sorted(e) for e in through] == [sorted(e) for e in direct]
