"""Through the gateway to two real fake upstreams: the first policy's routes."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient

from tests.gateway.fake_upstream import FakeUpstream

Client = TestClient[web.Request, web.Application]

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}], **extra}


def post_hi(
    session: aiohttp.ClientSession, gateway_url: str, route: str, *, stream: bool = False
) -> Any:
    """ "hi", forced onto one route: what the tests of a gateway process send."""
    return session.post(
        f"{gateway_url}/v1/chat/completions",
        json=chat("hi", stream=stream),
        headers={"x-specroute-route": route},
    )


async def test_json_schema_at_temperature_zero_goes_speculative(
    gateway: Client, spec_upstream: FakeUpstream, base_upstream: FakeUpstream
) -> None:
    body = chat(
        "Extract the person: Ada, 36.",
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
    )
    resp = await gateway.post("/v1/chat/completions", json=body)
    assert resp.status == 200
    assert resp.headers["x-specroute-route"] == "speculative"
    assert resp.headers["x-specroute-reason"] == "structured-low-temp"
    assert len(spec_upstream.received) == 1 and not base_upstream.received
    assert (await resp.json())["choices"][0]["message"]["content"].startswith("Hello")


async def test_hot_poem_goes_baseline(
    gateway: Client, spec_upstream: FakeUpstream, base_upstream: FakeUpstream
) -> None:
    body = chat("Write a wild poem about the sea.", temperature=1.2)
    resp = await gateway.post("/v1/chat/completions", json=body)
    assert resp.status == 200
    assert resp.headers["x-specroute-route"] == "baseline"
    assert resp.headers["x-specroute-reason"] == "high-temperature"
    assert len(base_upstream.received) == 1 and not spec_upstream.received


async def test_long_prompt_short_answer_goes_baseline(
    gateway: Client, base_upstream: FakeUpstream
) -> None:
    document = "The quarterly report lists revenue by region and product line. " * 300
    body = chat(document + "\nSummarise in one word.", temperature=0, max_tokens=16)
    resp = await gateway.post("/v1/chat/completions", json=body)
    assert resp.status == 200
    assert resp.headers["x-specroute-route"] == "baseline"
    assert resp.headers["x-specroute-reason"] == "prefill-bound"
    assert len(base_upstream.received) == 1


async def test_completions_endpoint_routes_too(
    gateway: Client, spec_upstream: FakeUpstream
) -> None:
    body = {"model": "fake-model", "prompt": "SELECT name FROM users WHERE", "temperature": 0}
    resp = await gateway.post("/v1/completions", json=body)
    assert resp.status == 200
    assert resp.headers["x-specroute-route"] == "speculative"
    assert (await resp.json())["choices"][0]["text"].startswith("Hello")
    assert spec_upstream.received == [body]


async def test_override_header_wins(gateway: Client, base_upstream: FakeUpstream) -> None:
    body = chat("{}", temperature=0, response_format={"type": "json_object"})
    resp = await gateway.post(
        "/v1/chat/completions", json=body, headers={"x-specroute-route": "baseline"}
    )
    assert resp.headers["x-specroute-route"] == "baseline"
    assert resp.headers["x-specroute-reason"] == "override"
    assert len(base_upstream.received) == 1


async def test_override_header_with_bad_value_is_a_400(gateway: Client) -> None:
    resp = await gateway.post(
        "/v1/chat/completions", json=chat("hi"), headers={"x-specroute-route": "fastest"}
    )
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["param"] == "x-specroute-route"


async def test_non_stream_body_is_forwarded_unchanged(
    gateway: Client, spec_upstream: FakeUpstream
) -> None:
    body = chat("hi", temperature=0, seed=7, logprobs=True, extra_field={"kept": [1, 2]})
    await gateway.post(
        "/v1/chat/completions", json=body, headers={"x-specroute-route": "speculative"}
    )
    assert spec_upstream.received == [body]
