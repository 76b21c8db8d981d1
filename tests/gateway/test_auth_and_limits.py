"""API keys (constant-time, never forwarded), the metrics token, the body-read deadline."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.auth import load_keys, matches
from gateway.config import AuthConfig, ConfigError, parse_config
from tests.gateway.conftest import ClientFactory, GatewayFactory, make_config
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_routing import chat

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def locked(
    aiohttp_client: ClientFactory,
    spec_server: TestServer,
    base_server: TestServer,
    tokens: TokenCounter,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Client:
    monkeypatch.setenv("TEST_GW_KEYS", "key-one, key-two")
    monkeypatch.setenv("TEST_METRICS_TOKEN", "scrape-me")
    monkeypatch.setenv("TEST_BACKEND_KEY", "backend-secret")
    keyfile = tmp_path / "keys"
    keyfile.write_text("key-three\n\n")
    raw = {
        "backends": {
            "speculative": {
                "urls": [str(spec_server.make_url(""))],
                "api_key_env": "TEST_BACKEND_KEY",
            },
            "baseline": {"urls": [str(base_server.make_url(""))]},
        },
        "auth": {
            "api_keys_env": "TEST_GW_KEYS",
            "api_keys_file": str(keyfile),
            "metrics_token_env": "TEST_METRICS_TOKEN",
        },
    }
    return await aiohttp_client(create_app(parse_config(raw), tokens=tokens))


@pytest.mark.parametrize(
    "header", [None, "Bearer nope", "Basic key-one", "Bearer key-one-extra", "Bearer "]
)
async def test_missing_or_wrong_key_is_401(locked: Client, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    resp = await locked.post("/v1/chat/completions", json=chat("hi"), headers=headers)
    assert resp.status == 401
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    error = (await resp.json())["error"]
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    assert (await locked.get("/v1/models", headers=headers)).status == 401


@pytest.mark.parametrize("key", ["key-one", "key-two", "key-three"])
async def test_good_key_passes_and_is_never_forwarded(
    locked: Client, spec_upstream: FakeUpstream, key: str
) -> None:
    resp = await locked.post(
        "/v1/chat/completions",
        json=chat("hi"),
        headers={"Authorization": f"Bearer {key}", "x-specroute-route": "speculative"},
    )
    assert resp.status == 200
    seen = spec_upstream.headers_seen[0]
    assert seen["Authorization"] == "Bearer backend-secret"  # the backend's own key
    assert key not in repr(seen)


async def test_health_is_open_and_metrics_has_its_own_token(locked: Client) -> None:
    assert (await locked.get("/health")).status == 200
    assert (await locked.get("/ready")).status == 200
    assert (await locked.get("/metrics")).status == 401
    assert (await locked.get("/metrics", headers={"Authorization": "Bearer key-one"})).status == 401
    ok = await locked.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
    assert ok.status == 200


def test_matches_checks_every_key() -> None:
    assert matches(b"b", (b"a", b"b", b"c"))
    assert not matches(b"", (b"a",))
    assert not matches(b"a", ())


def test_key_sources_that_hold_nothing_are_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMPTY_KEYS", " , ")
    with pytest.raises(ConfigError, match="holds no key"):
        load_keys(AuthConfig(api_keys_env="EMPTY_KEYS"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_keys(AuthConfig(api_keys_file="/nonexistent/keys"))


async def test_slow_body_gets_408(
    aiohttp_server: object,
    spec_server: TestServer,
    base_server: TestServer,
    tokens: TokenCounter,
) -> None:
    config = make_config(
        str(spec_server.make_url("")),
        str(base_server.make_url("")),
        server={"body_read_timeout_s": 0.3},
    )
    server = await aiohttp_server(create_app(config, tokens=tokens))  # type: ignore[operator]
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 500\r\n\r\n{"messages": ['
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    assert head.startswith(b"HTTP/1.1 408")
    writer.close()
    await writer.wait_closed()


async def test_without_a_metrics_token_metrics_takes_the_api_keys(
    gateway_for: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keys apply to every path (README): /metrics answered anyone until a metrics
    token was set. A token, once set, replaces the keys there (the test above)."""
    monkeypatch.setenv("TEST_GW_KEYS", "key-one")
    gateway = await gateway_for(auth={"api_keys_env": "TEST_GW_KEYS"})
    refused = await gateway.get("/metrics")
    assert refused.status == 401
    assert (await refused.json())["error"]["code"] == "invalid_api_key"
    assert (await gateway.get("/metrics", headers={"Authorization": "Bearer nope"})).status == 401
    ok = await gateway.get("/metrics", headers={"Authorization": "Bearer key-one"})
    assert ok.status == 200 and "specroute_requests_total" in await ok.text()
    assert (await gateway.get("/health")).status == 200  # still open: probes carry no key
