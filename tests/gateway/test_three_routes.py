"""Three routes through the gateway's request path: routed, forced, failed over, copied.

Fake upstreams on 127.0.0.1 ephemeral ports behind [routes.NAME] tables ("none",
"ngram-k2", "ngram-k4"): which server a request reaches is what the upstream
received, not what the gateway says.
"""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from classifier.tokens import TokenCounter
from classifier.types import Route
from gateway.app import create_app
from gateway.state import BACKENDS
from tests.gateway.conftest import ClientFactory, ServerFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_observability import samples
from tests.gateway.three_routes import NAMES, three_routes_config
from tests.support import wait_until

STRUCTURED = {
    "model": "fake-model",
    "messages": [{"role": "user", "content": "Give me the JSON"}],
    "response_format": {"type": "json_object"},
    "temperature": 0.0,
    "max_tokens": 8,
}
CREATIVE = {
    "model": "fake-model",
    "messages": [{"role": "user", "content": "Write a poem"}],
    "temperature": 1.3,
    "max_tokens": 8,
}

Gateway = TestClient[web.Request, web.Application]


@pytest.fixture
def upstreams() -> dict[str, FakeUpstream]:
    return {name: FakeUpstream(name) for name in NAMES}


@pytest.fixture
async def servers(
    aiohttp_server: ServerFactory, upstreams: dict[str, FakeUpstream]
) -> dict[str, TestServer]:
    return {name: await aiohttp_server(u.app()) for name, u in upstreams.items()}


async def _gateway(
    aiohttp_client: ClientFactory,
    servers: dict[str, TestServer],
    tokens: TokenCounter,
    **sections: dict[str, Any],
) -> Gateway:
    urls = [str(servers[name].make_url("")) for name in NAMES]
    config = three_routes_config(urls, sections={"shadow": {"enabled": False}, **sections})
    return await aiohttp_client(create_app(config, tokens=tokens))


async def test_the_rules_send_each_kind_to_its_route_and_the_header_names_it(
    aiohttp_client: ClientFactory,
    servers: dict[str, TestServer],
    upstreams: dict[str, FakeUpstream],
    tokens: TokenCounter,
) -> None:
    """Under the rules, "speculate" is the first speculative route and "not" the first
    plain one, whatever their names."""
    gateway = await _gateway(aiohttp_client, servers, tokens, routing={"policy": "rules"})
    resp = await gateway.post("/v1/chat/completions", json=STRUCTURED)
    assert resp.status == 200 and resp.headers["x-specroute-route"] == "ngram-k2"
    resp = await gateway.post("/v1/chat/completions", json=CREATIVE)
    assert resp.status == 200 and resp.headers["x-specroute-route"] == "none"
    assert [len(upstreams[n].received) for n in NAMES] == [1, 1, 0]


async def test_the_override_header_names_any_route_and_refuses_others(
    aiohttp_client: ClientFactory,
    servers: dict[str, TestServer],
    upstreams: dict[str, FakeUpstream],
    tokens: TokenCounter,
) -> None:
    gateway = await _gateway(aiohttp_client, servers, tokens, routing={"policy": "rules"})
    resp = await gateway.post(
        "/v1/chat/completions", json=CREATIVE, headers={"x-specroute-route": "ngram-k4"}
    )
    assert resp.status == 200 and resp.headers["x-specroute-route"] == "ngram-k4"
    assert len(upstreams["ngram-k4"].received) == 1
    resp = await gateway.post(
        "/v1/chat/completions", json=CREATIVE, headers={"x-specroute-route": "speculative"}
    )
    body = await resp.json()
    assert resp.status == 400 and body["error"]["param"] == "x-specroute-route"
    assert "'none', 'ngram-k2', 'ngram-k4'" in body["error"]["message"]


async def test_a_failed_route_hands_over_to_the_decisions_next_cheapest(
    aiohttp_client: ClientFactory,
    servers: dict[str, TestServer],
    upstreams: dict[str, FakeUpstream],
    tokens: TokenCounter,
) -> None:
    """A 5xx before any byte goes to the route the decision ranked second, not to the
    configuration's next: on the built-in prior n-gram drafts cost nothing (draft
    cost 0), so for structured output k=4 ranks first and k=2 second, "none" last."""
    no_draws = {"profile": "off", "tuning": {"explore_max_regret": 0.0}}  # the mean's choice
    gateway = await _gateway(aiohttp_client, servers, tokens, routing=no_draws)
    resp = await gateway.post("/v1/chat/completions", json=STRUCTURED)
    predicted = dict(p.split("=") for p in resp.headers["x-specroute-predicted"].split(";"))
    ranked = sorted(predicted, key=lambda r: float(predicted[r]))
    assert ranked == ["ngram-k4", "ngram-k2", "none"], predicted
    assert resp.headers["x-specroute-route"] == "ngram-k4"
    upstreams["ngram-k4"].fail_status = 503
    resp = await gateway.post("/v1/chat/completions", json=STRUCTURED)
    assert resp.status == 200
    assert (resp.headers["x-specroute-route"], resp.headers["x-specroute-failover"]) == (
        "ngram-k2",
        "ngram-k4",
    )
    assert len(upstreams["none"].received) == 0
    upstreams["ngram-k2"].healthy = False  # the second is down: the third answers
    pool = gateway.app[BACKENDS]
    await wait_until(lambda: not pool.of(Route("ngram-k2")).healthy, "ngram-k2 marked down")
    resp = await gateway.post("/v1/chat/completions", json=STRUCTURED)
    assert resp.status == 200 and resp.headers["x-specroute-route"] == "none"


async def test_shadow_copies_spread_over_the_routes_not_chosen(
    aiohttp_client: ClientFactory,
    servers: dict[str, TestServer],
    upstreams: dict[str, FakeUpstream],
    tokens: TokenCounter,
) -> None:
    """Every answer is copied (share 1) to one of the two routes it did not take, in
    idle time: both of them get copies, the chosen one none."""
    gateway = await _gateway(
        aiohttp_client,
        servers,
        tokens,
        routing={"policy": "static-none"},
        shadow={"enabled": True, "share": 1.0},
    )

    def copied() -> int:
        return sum(len(upstreams[n].received) for n in NAMES[1:])

    for sent in range(1, 13):
        resp = await gateway.post("/v1/chat/completions", json=STRUCTURED)
        assert resp.status == 200 and resp.headers["x-specroute-route"] == "none"
        await resp.read()
        await wait_until(lambda n=sent: copied() == n, f"copy {sent} sent")  # type: ignore[misc]
    copies = {n: len(upstreams[n].received) for n in NAMES}
    assert copies["none"] == 12, copies  # the users' requests only
    assert copies["ngram-k2"] > 0 and copies["ngram-k4"] > 0, copies
    metrics = samples(await (await gateway.get("/metrics")).text())
    shadows = {
        labels: v
        for (name, labels), v in metrics.items()
        if name == "specroute_shadow_requests_total"
    }
    assert sum(shadows.values()) >= copies["ngram-k2"] + copies["ngram-k4"]
