"""The rest of vLLM's API through the gateway: each path's fate, and passthrough's
promises (unchanged bytes and headers, auth, refusals, failover, disconnects).

tests/vllm/test_route_table_real_vllm.py checks the fate of every path in the
installed vLLM's own route table.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from classifier.tokens import TokenCounter
from gateway.api.passthrough import Fate, fate_of
from gateway.app import create_app
from gateway.state import RUNTIME
from tests.gateway.conftest import make_config
from tests.gateway.fake_vllm_rest import FakeVllmRest
from tooling.local_stack import serve_app

Client = TestClient[web.Request, web.Application]
ServerFactory = Callable[[web.Application], Awaitable[TestServer]]
ClientFactory = Callable[[web.Application], Awaitable[Client]]


@pytest.fixture
def spec_rest() -> FakeVllmRest:
    return FakeVllmRest("speculative")


@pytest.fixture
def base_rest() -> FakeVllmRest:
    return FakeVllmRest("baseline")


@pytest.fixture
async def rest_servers(
    aiohttp_server: ServerFactory, spec_rest: FakeVllmRest, base_rest: FakeVllmRest
) -> tuple[TestServer, TestServer]:
    return await aiohttp_server(spec_rest.app()), await aiohttp_server(base_rest.app())


RestGateway = Callable[..., Awaitable[Client]]


@pytest.fixture
def rest_gateway(
    aiohttp_client: ClientFactory, rest_servers: tuple[TestServer, TestServer], tokens: TokenCounter
) -> RestGateway:
    async def make(**sections: dict[str, object]) -> Client:
        spec, base = rest_servers
        config = make_config(str(spec.make_url("")), str(base.make_url("")), **sections)
        return await aiohttp_client(create_app(config, tokens=tokens))

    return make


@pytest.mark.parametrize(
    ("method", "path", "fate"),
    [
        ("POST", "/v1/chat/completions", Fate.ROUTED),
        ("POST", "/v1/responses", Fate.ROUTED),
        ("GET", "/v1/responses/resp_1", Fate.STORED),
        ("POST", "/v1/responses/resp_1/cancel", Fate.STORED),
        ("POST", "/v1/responses/resp_1/other", Fate.FORBIDDEN),
        ("POST", "/v1/responses/render", Fate.PASSTHROUGH),
        ("DELETE", "/v1/responses/resp_1", Fate.FORBIDDEN),
        ("GET", "/metrics", Fate.GATEWAY),
        ("GET", "/ui/app.js", Fate.GATEWAY),
        ("POST", "/decide/v1/completions", Fate.GATEWAY),
        ("POST", "/tokenize", Fate.PASSTHROUGH),
        ("GET", "/version", Fate.PASSTHROUGH),
        ("GET", "/v1/never-heard-of", Fate.PASSTHROUGH),  # vLLM's own 404
        ("POST", "/v1/never-heard-of", Fate.FORBIDDEN),  # a write nobody allowed
        ("DELETE", "/tokenize", Fate.FORBIDDEN),
        ("POST", "/sleep", Fate.FORBIDDEN),
        ("GET", "/is_sleeping", Fate.FORBIDDEN),
        ("POST", "/adapters", Fate.FORBIDDEN),
        ("DELETE", "/adapters/my-lora", Fate.FORBIDDEN),
        ("GET", "/fault_tolerance/status", Fate.FORBIDDEN),
        # vLLM mounts /metrics on a bare prefix: every path that starts with it is ours.
        ("GET", "/metrics/", Fate.GATEWAY),
        ("GET", "/metricsX", Fate.GATEWAY),
        ("GET", "/metrics/../v1/x", Fate.GATEWAY),
        ("GET", "//metrics", Fate.GATEWAY),
        ("GET", "/x/../metrics", Fate.GATEWAY),
        ("GET", "/health/", Fate.GATEWAY),
        ("GET", "/v1/models/x", Fate.GATEWAY),
        ("GET", "/healthz", Fate.PASSTHROUGH),  # not under /health
        ("GET", "//sleep", Fate.FORBIDDEN),
        ("GET", "/x/../is_sleeping", Fate.FORBIDDEN),
    ],
)
def test_fate_of(method: str, path: str, fate: Fate) -> None:
    assert fate_of(method, path) is fate


def test_the_gateways_own_routes_are_never_passed_through(tokens: TokenCounter) -> None:
    app = create_app(make_config("http://127.0.0.1:1", "http://127.0.0.1:2"), tokens=tokens)
    for route in app.router.routes():
        path = route.resource.canonical if route.resource else ""
        if path == "/{tail}":
            continue  # the catch-all itself
        assert fate_of(route.method, path) in (Fate.ROUTED, Fate.STORED, Fate.GATEWAY), path


async def test_passthrough_is_unchanged_both_ways(
    rest_gateway: RestGateway, spec_rest: FakeVllmRest, base_rest: FakeVllmRest
) -> None:
    gateway = await rest_gateway()
    body = b'{"prompt": "one two three", "model": "fake-model"}'
    resp = await gateway.post(
        "/tokenize?add_special_tokens=false",
        data=body,
        headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer client-key",
            "X-Custom": "kept",
            "Connection": "keep-alive, X-Hop",
            "X-Hop": "dropped",
            "x-specroute-route": "baseline",
        },
    )
    assert resp.status == 200
    answer = await resp.json()
    assert answer == {"count": 3, "tokens": [0, 1, 2], "server": "baseline"}
    assert resp.headers["X-Backend-Header"] == "baseline"  # a backend's header comes back
    assert "Keep-Alive" not in resp.headers  # a hop-by-hop one does not
    assert spec_rest.seen == []
    assert base_rest.seen == [("POST", "/tokenize?add_special_tokens=false")]
    assert base_rest.bodies == [body]
    sent = base_rest.headers_seen[0]
    assert sent["X-Custom"] == "kept"
    assert "Authorization" not in sent  # the client's key stays at the gateway
    assert "X-Hop" not in sent and "x-specroute-route" not in {k.lower() for k in sent}


async def test_unknown_read_gets_the_backends_own_404(rest_gateway: RestGateway) -> None:
    gateway = await rest_gateway()
    resp = await gateway.get("/v1/never-heard-of")
    assert (resp.status, await resp.text()) == (404, "404: Not Found")  # aiohttp's, not ours


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/sleep"), ("GET", "/server_info"), ("POST", "/v1/nothing")]
)
async def test_operator_paths_are_refused_and_logged(
    rest_gateway: RestGateway,
    spec_rest: FakeVllmRest,
    base_rest: FakeVllmRest,
    method: str,
    path: str,
) -> None:
    gateway = await rest_gateway()
    with capture_logs() as logs:
        resp = await gateway.request(method, path, json={})
    assert resp.status == 403
    error = (await resp.json())["error"]
    assert error["type"] == "permission_error" and error["code"] == "forbidden_path"
    assert set(error) == {"message", "type", "param", "code"}
    assert spec_rest.seen == base_rest.seen == []
    assert [e["path"] for e in logs if e["event"] == "forbidden_path"] == [path]


async def test_one_request_id_for_the_backend_the_log_and_the_client(
    rest_gateway: RestGateway, spec_rest: FakeVllmRest, base_rest: FakeVllmRest
) -> None:
    """Before: without X-Request-Id, the backend, the log line and the client each saw
    a different id (the client none). A refusal's lines and answer agree too."""
    gateway = await rest_gateway()
    with capture_logs() as logs:
        resp = await gateway.get("/version")
    assert resp.status == 200
    sent = {k.lower(): v for k, v in (spec_rest.headers_seen + base_rest.headers_seen)[0].items()}
    (line,) = [e for e in logs if e["event"] == "request"]
    assert resp.headers["X-Request-Id"] == sent["x-request-id"] == line["request_id"]
    with capture_logs() as logs:
        resp = await gateway.post("/sleep")
    assert resp.status == 403
    assert {e["request_id"] for e in logs} == {resp.headers["X-Request-Id"]}


async def test_passthrough_and_models_are_refused_while_draining(
    rest_gateway: RestGateway, spec_rest: FakeVllmRest, base_rest: FakeVllmRest
) -> None:
    """After SIGTERM every new request gets 503, not only the routed ones."""
    gateway = await rest_gateway()
    gateway.app[RUNTIME].draining = True
    for method, path in (("GET", "/version"), ("POST", "/tokenize"), ("GET", "/v1/models")):
        resp = await gateway.request(method, path, json={"prompt": "a"})
        assert resp.status == 503, path
        assert (await resp.json())["error"]["code"] == "draining"
        assert resp.headers["Retry-After"] == "1"
    assert spec_rest.seen == base_rest.seen == []


async def test_auth_applies_to_passed_through_paths(
    rest_gateway: RestGateway, base_rest: FakeVllmRest, monkeypatch: Any
) -> None:
    monkeypatch.setenv("SPECROUTE_TEST_KEYS", "k1")
    gateway = await rest_gateway(auth={"api_keys_env": "SPECROUTE_TEST_KEYS"})
    assert (await gateway.get("/version")).status == 401
    assert (await gateway.post("/sleep")).status == 401
    resp = await gateway.get("/version", headers={"Authorization": "Bearer k1"})
    assert (resp.status, await resp.json()) == (200, {"version": "0.32.0"})


async def test_bodies_are_bounded_by_the_max_body_setting(rest_gateway: RestGateway) -> None:
    gateway = await rest_gateway(server={"max_body_bytes": 1024})
    resp = await gateway.post("/tokenize", data=b"x" * 4096)
    assert resp.status == 413
    assert (await resp.json())["error"]["type"] == "invalid_request_error"


async def test_a_refused_connection_fails_over_to_the_other_backend(
    aiohttp_client: ClientFactory,
    rest_servers: tuple[TestServer, TestServer],
    tokens: TokenCounter,
    unused_tcp_port: int,
) -> None:
    _, base = rest_servers
    dead = f"http://127.0.0.1:{unused_tcp_port}"  # nothing listens there
    config = make_config(dead, str(base.make_url("")))
    gateway = await aiohttp_client(create_app(config, tokens=tokens))
    resp = await gateway.post(
        "/tokenize", json={"prompt": "a b"}, headers={"x-specroute-route": "speculative"}
    )
    assert resp.status == 200
    assert (await resp.json())["server"] == "baseline"


@pytest.fixture
async def production_gateway(
    rest_servers: tuple[TestServer, TestServer], tokens: TokenCounter
) -> AsyncIterator[str]:
    spec, base = rest_servers
    config = make_config(str(spec.make_url("")), str(base.make_url("")))
    runner, url = await serve_app(create_app(config, tokens=tokens))  # handler cancellation on
    try:
        yield url
    finally:
        await runner.cleanup()


async def test_a_client_disconnect_cancels_the_passed_through_request(
    production_gateway: str, base_rest: FakeVllmRest
) -> None:
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            f"{production_gateway}/v1/audio/transcriptions",
            data=b"audio",
            headers={"x-specroute-route": "baseline"},
        )
        assert resp.status == 200
        assert (await resp.content.readline()).startswith(b"data: 0")
        resp.close()  # the client goes away mid-stream
        await asyncio.wait_for(base_rest.cancelled.wait(), timeout=2.0)


# Spellings of the gateway's own paths that aiohttp's router does not send to its route:
# each must get the gateway's 404, and the backend must never see it.
GATEWAY_SPELLINGS = (
    "/metrics/",
    "/metricsX",
    "/metrics%2F",
    "/metrics%2fx",
    "/metrics;x",
    "/metrics/../v1/x",
    "//metrics",
    "/%2Fmetrics",
    "/./metrics",
    "/%2e/metrics",
    "/x/../metrics",
    "/health/",
    "//health",
    "/v1/models/",
)


@dataclass
class RecordingUpstream:
    """Answers every path as vLLM answers its /metrics mount, and records each request
    that came from a client (the gateway's own probes and scrapes carry no X-Probe)."""

    seen: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        async def answer(request: web.Request) -> web.Response:
            if "X-Probe" in request.headers:
                self.seen.append(request.raw_path)
            return web.Response(text="vllm:num_requests_running 0\n")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        return app


async def _raw_get(port: int, target: str, headers: str = "") -> tuple[int, bytes]:
    """GET `target` exactly as written (no client library normalises it); status, body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = f"GET {target} HTTP/1.1\r\nHost: gw\r\nX-Probe: 1\r\n{headers}Connection: close\r\n"
    writer.write(head.encode() + b"\r\n")
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


async def test_gateway_paths_in_any_spelling_never_reach_the_backend(
    aiohttp_server: ServerFactory,
    aiohttp_client: ClientFactory,
    tokens: TokenCounter,
    monkeypatch: Any,
) -> None:
    """Before: /metrics/, /metricsX and /metrics%2F went to the backend, whose /metrics
    mount answered them past the gateway's metrics token."""
    monkeypatch.setenv("SPECROUTE_TEST_METRICS_TOKEN", "scraper")
    upstream = RecordingUpstream()
    server = await aiohttp_server(upstream.app())
    url = str(server.make_url(""))
    config = make_config(url, url, auth={"metrics_token_env": "SPECROUTE_TEST_METRICS_TOKEN"})
    gateway = await aiohttp_client(create_app(config, tokens=tokens))
    port = gateway.port
    assert port is not None
    for target in GATEWAY_SPELLINGS:
        status, body = await _raw_get(port, target)
        assert status == 404, target
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "not_found_error"
    # aiohttp decodes /%6detrics to /metrics: the gateway's own, behind its token.
    assert (await _raw_get(port, "/%6detrics"))[0] == 401
    status, body = await _raw_get(port, "/%6detrics", "Authorization: Bearer scraper\r\n")
    assert status == 200 and b"specroute_" in body
    assert upstream.seen == []
    assert (await _raw_get(port, "/version"))[0] == 200  # passthrough itself still works
    assert upstream.seen == ["/version"]
