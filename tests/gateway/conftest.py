from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from classifier.tokens import TokenCounter, load_tiktoken_counter
from gateway.app import create_app
from gateway.config import Config, parse_config
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.misbehaving_upstream import MisbehavingUpstream

ServerFactory = Callable[[web.Application], Awaitable[TestServer]]
ClientFactory = Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]]


@pytest.fixture(scope="session")
def tokens() -> TokenCounter:
    return load_tiktoken_counter("cl100k_base")


@pytest.fixture
def spec_upstream() -> FakeUpstream:
    return FakeUpstream("speculative")


@pytest.fixture
def base_upstream() -> FakeUpstream:
    return FakeUpstream("baseline")


@pytest.fixture
async def spec_server(aiohttp_server: ServerFactory, spec_upstream: FakeUpstream) -> TestServer:
    return await aiohttp_server(spec_upstream.app())


@pytest.fixture
async def base_server(aiohttp_server: ServerFactory, base_upstream: FakeUpstream) -> TestServer:
    return await aiohttp_server(base_upstream.app())


def make_config(spec_url: str, base_url: str, **sections: dict[str, object]) -> Config:
    raw: dict[str, object] = {
        "backends": {"speculative": {"urls": [spec_url]}, "baseline": {"urls": [base_url]}},
        "upstream": {"health_interval_s": 0.2, "connect_timeout_s": 1.0, "read_timeout_s": 5.0},
        # Most gateway tests check the rules' routes; the cost model has its own tests.
        "routing": {"policy": "rules"},
    }
    for name, values in sections.items():
        merged = dict(raw.get(name, {}))  # type: ignore[call-overload]
        merged.update(values)
        raw[name] = merged
    return parse_config(raw)


@pytest.fixture
def config(spec_server: TestServer, base_server: TestServer) -> Config:
    return make_config(str(spec_server.make_url("")), str(base_server.make_url("/v1")))


@pytest.fixture
async def gateway(
    aiohttp_client: ClientFactory, config: Config, tokens: TokenCounter
) -> TestClient[web.Request, web.Application]:
    return await aiohttp_client(create_app(config, tokens=tokens))


GatewayFactory = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]


@pytest.fixture
def gateway_for(
    aiohttp_client: ClientFactory,
    spec_server: TestServer,
    base_server: TestServer,
    tokens: TokenCounter,
) -> GatewayFactory:
    """A gateway in front of the two fake upstreams, with config sections overridden."""

    async def make(**sections: dict[str, object]) -> TestClient[web.Request, web.Application]:
        config = make_config(
            str(spec_server.make_url("")), str(base_server.make_url("")), **sections
        )
        return await aiohttp_client(create_app(config, tokens=tokens))

    return make


RawUpstreams = tuple[MisbehavingUpstream, MisbehavingUpstream]


@pytest.fixture
async def raw_upstreams() -> AsyncIterator[RawUpstreams]:
    """Two raw backends (speculative, baseline) that answer well until told otherwise,
    and record the bytes they were sent."""
    spec, base = MisbehavingUpstream("speculative"), MisbehavingUpstream("baseline")
    await spec.start()
    await base.start()
    yield spec, base
    await spec.close()
    await base.close()
