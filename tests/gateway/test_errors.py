"""Every error leaves in OpenAI's shape with the right status; nothing is a 500."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from classifier.tokens import TokenCounter
from gateway.app import create_app
from tests.gateway.conftest import ClientFactory, GatewayFactory, make_config
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_routing import chat

Client = TestClient[web.Request, web.Application]


async def error_of(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    error = (await resp.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return dict(error)


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        ("/v1/chat/completions", b"{not json", None),
        ("/v1/chat/completions", b"[1, 2]", None),
        ("/v1/chat/completions", b'"just a string"', None),
        ("/v1/chat/completions", b"{}", "messages"),
        ("/v1/chat/completions", b'{"messages": "hi"}', "messages"),
        ("/v1/chat/completions", b'{"messages": []}', "messages"),
        ("/v1/chat/completions", b'{"messages": [42]}', "messages[0]"),
        ("/v1/chat/completions", b'{"messages": [{"content": "x"}]}', "messages[0].role"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": 5}]}',
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
            "temperature",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
            None,
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x"}], "temperature": -1}',
            "temperature",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e400}',
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 99999999999999999999}',
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
            "stream",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x"}], "response_format": "json"}',
            "response_format",
        ),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "n": 0}', "n"),
        ("/v1/chat/completions", b"\xff\xfe{}", None),
        ("/v1/completions", b"{}", "prompt"),
        ("/v1/completions", b'{"prompt": {"a": 1}}', "prompt"),
        ("/v1/completions", b'{"prompt": [1, "a"]}', "prompt"),
    ],
)
async def test_bad_bodies_are_400(
    gateway: Client, base_upstream: FakeUpstream, path: str, raw: bytes, param: str | None
) -> None:
    resp = await gateway.post(path, data=raw, headers={"Content-Type": "application/json"})
    error = await error_of(resp, 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert not base_upstream.received


async def test_body_over_limit_is_413(gateway_for: GatewayFactory) -> None:
    client = await gateway_for(server={"max_body_bytes": 1024})
    resp = await client.post("/v1/chat/completions", json=chat("x" * 2000))
    await error_of(resp, 413)


async def test_unknown_content_type_is_415(gateway: Client) -> None:
    resp = await gateway.post(
        "/v1/chat/completions", data=b"messages=hi", headers={"Content-Type": "text/csv"}
    )
    await error_of(resp, 415)


async def test_unknown_path_is_the_backends_404_and_wrong_method_405(gateway: Client) -> None:
    """An unknown path is passed through (gateway/api/passthrough.py): the backend's own
    answer, here the fake upstream's aiohttp 404; a wrong method on the gateway's
    own route is the gateway's 405."""
    missing = await gateway.get("/v1/nothing-here")
    assert (missing.status, await missing.text()) == (404, "404: Not Found")
    await error_of(await gateway.get("/v1/chat/completions"), 405)


@pytest.mark.parametrize("status", [400, 404, 422, 500, 503])
async def test_backend_error_body_is_relayed_unchanged(
    gateway: Client, spec_upstream: FakeUpstream, base_upstream: FakeUpstream, status: int
) -> None:
    """A 4xx is never retried; a 5xx is relayed when the other backend fails too."""
    spec_upstream.fail_status = status
    base_upstream.fail_status = status
    resp = await gateway.post(
        "/v1/chat/completions", json=chat("hi"), headers={"x-specroute-route": "speculative"}
    )
    assert resp.status == status
    answered = "speculative" if status < 500 else "baseline"
    assert resp.headers["x-specroute-route"] == answered
    body = await resp.json()
    assert body["error"]["message"] == f"{answered} fails on purpose"
    assert body["error"]["code"] == status
    assert len(base_upstream.received) == (status >= 500)


async def test_unreachable_backends_are_502(
    aiohttp_client: ClientFactory, unused_tcp_port_factory: Any, tokens: TokenCounter
) -> None:
    dead = [f"http://127.0.0.1:{unused_tcp_port_factory()}" for _ in range(2)]
    client = await aiohttp_client(create_app(make_config(*dead), tokens=tokens))
    resp = await client.post(
        "/v1/chat/completions", json=chat("hi"), headers={"x-specroute-route": "speculative"}
    )
    error = await error_of(resp, 502)
    assert error["code"] == "connect"
    assert "unreachable" in error["message"]
    metrics = await (await client.get("/metrics")).text()
    # Down, not sick: speculative, baseline, then speculative again (it may have restarted).
    assert 'specroute_upstream_errors_total{kind="connect",route="speculative"} 2.0' in metrics
    assert 'specroute_upstream_errors_total{kind="connect",route="baseline"} 1.0' in metrics
