"""/decide and /stats with three configured routes ("none", "ngram-k2", "ngram-k4"):
every per-route figure under the route's name, in the configuration's order, each
route with its own k; the decision's why as the router gives it.

Fake upstreams or emulated servers on 127.0.0.1 ephemeral ports, the gateway in
front as production builds it (create_app).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from classifier.features import Workload
from classifier.router import ProfiledPolicy
from classifier.speculation import acceptance_rate, alpha_from_rate
from classifier.tokens import TokenCounter
from classifier.types import Route
from gateway.app import create_app
from gateway.state import RUNTIME
from tests.gateway.conftest import ClientFactory, ServerFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_routing import chat
from tests.gateway.test_ui import STRUCTURED, conforms
from tests.gateway.three_routes import NAMES, SPECULATIVE, K, three_route_stack, three_routes_config
from tests.support import wait_until

Client = TestClient[web.Request, web.Application]
ROUTES = [
    {"name": "none", "method": "none", "num_speculative_tokens": 0},
    {"name": "ngram-k2", "method": "ngram", "num_speculative_tokens": 2},
    {"name": "ngram-k4", "method": "ngram", "num_speculative_tokens": 4},
]


@pytest.fixture
def upstreams() -> dict[str, FakeUpstream]:
    return {name: FakeUpstream(name) for name in NAMES}


@pytest.fixture
def three(
    aiohttp_server: ServerFactory,
    aiohttp_client: ClientFactory,
    upstreams: dict[str, FakeUpstream],
    tokens: TokenCounter,
) -> Any:
    """A gateway over three fake upstreams, with config sections overridden."""

    async def make(**sections: dict[str, object]) -> Client:
        servers = [await aiohttp_server(upstreams[name].app()) for name in NAMES]
        config = three_routes_config([str(s.make_url("")) for s in servers], sections=sections)
        return await aiohttp_client(create_app(config, tokens=tokens))

    return make


async def decide(gateway: Client, body: dict[str, Any]) -> dict[str, Any]:
    resp = await gateway.post("/decide/v1/chat/completions", json=body)
    assert resp.status == 200, await resp.text()
    # The text, not resp.json(): the keys' order is part of the answer.
    got: dict[str, Any] = json.loads(await resp.text())
    return got


async def test_a_dry_run_names_every_route_in_order_with_its_own_k(
    three: Any, upstreams: dict[str, FakeUpstream]
) -> None:
    gateway = await three(routing={"policy": "profiled"})
    policy = gateway.app[RUNTIME].current.policy
    assert isinstance(policy, ProfiledPolicy)
    got = await decide(gateway, STRUCTURED)
    conforms(got, "Decision")
    assert all(u.received == [] for u in upstreams.values())  # nothing forwarded
    assert got["routes"] == ROUTES
    predicted = got["predicted_s"]
    assert list(predicted) == list(NAMES)
    assert list(got["backends"]) == list(NAMES)
    assert got["backends"]["ngram-k2"]["inflight"] == 0
    # Speedups over the first route without speculation, for every route.
    assert got["speedup_over"] == "none"
    speedup = got["predicted_speedup"]
    assert list(speedup) == list(NAMES) and speedup["none"] == 1.0
    for name in SPECULATIVE:
        assert speedup[name] == pytest.approx(predicted["none"] / predicted[name], rel=1e-3)
    # The why as the router gives it: per-route dicts under the routes' names.
    why = got["why"]
    assert list(why["cost_s"]) == list(NAMES)
    assert list(why["acceptance"]) == list(SPECULATIVE)
    assert list(why["tokens_per_step"]) == list(SPECULATIVE)
    assert got["reason"] == "unprofiled" and why["rule"] == "smaller-cost"
    assert got["route"] == min(why["cost_s"], key=why["cost_s"].get)
    # Acceptance per speculative route, each with its own k: the rate the decision used.
    acceptance = got["acceptance"]
    assert list(acceptance) == list(SPECULATIVE)
    for name in SPECULATIVE:
        a = acceptance[name]
        assert a["num_speculative_tokens"] == K[name] and a["workload"] == "structured"
        assert a["rate"] == pytest.approx(why["acceptance"][name], abs=1e-4)
        assert a["per_position"] == pytest.approx(alpha_from_rate(a["rate"], K[name]), abs=1e-4)
    # Each route's tokens per step follows its own k: 1 + k x rate.
    for name in SPECULATIVE:
        rate = acceptance[name]["rate"]
        assert why["tokens_per_step"][name] == pytest.approx(1 + K[name] * rate, abs=2e-3)
    # The gateway then sends the same body: where the dry run said, unless its draw of
    # the ngram drafter's a (neutral before any answer) explored the other k.
    real = await gateway.post("/v1/chat/completions", json=STRUCTURED)
    assert real.status == 200
    sent = real.headers["x-specroute-route"]
    assert sent == got["route"] or sent in SPECULATIVE
    assert upstreams[sent].received  # the chosen route's server answered


async def test_under_the_rules_the_first_speculative_and_first_plain_routes(
    three: Any,
) -> None:
    gateway = await three(routing={"policy": "rules"})
    structured = await decide(gateway, STRUCTURED)
    conforms(structured, "Decision")
    assert structured["route"] == "ngram-k2" and structured["reason"] == "structured-low-temp"
    assert structured["predicted_s"] is None and structured["predicted_speedup"] is None
    assert structured["speedup_over"] == "none"  # the reference exists; no predictions
    assert {name: a["rate"] for name, a in structured["acceptance"].items()} == {
        "ngram-k2": None,
        "ngram-k4": None,
    }
    assert [a["num_speculative_tokens"] for a in structured["acceptance"].values()] == [2, 4]
    creative = await decide(gateway, chat("Write a poem.", temperature=1.3))
    assert creative["route"] == "none" and creative["reason"] == "high-temperature"


async def test_a_static_policy_names_its_route(three: Any) -> None:
    gateway = await three(routing={"policy": "static-ngram-k4"})
    got = await decide(gateway, chat("hi"))
    conforms(got, "Decision")
    assert (got["route"], got["reason"]) == ("ngram-k4", "static")
    assert got["routes"] == ROUTES


async def test_stats_counts_every_route_by_name_in_order(
    three: Any, upstreams: dict[str, FakeUpstream]
) -> None:
    gateway = await three(routing={"policy": "profiled"})
    for route in ("none", "ngram-k4", "ngram-k4"):
        resp = await gateway.post(
            "/v1/chat/completions", json=STRUCTURED, headers={"x-specroute-route": route}
        )
        assert resp.status == 200
        await resp.read()
    assert len(upstreams["ngram-k4"].received) == 2 and not upstreams["ngram-k2"].received
    resp = await gateway.get("/stats")
    assert resp.status == 200
    stats = json.loads(await resp.text())
    conforms(stats, "Stats")
    assert stats["routes"] == ROUTES
    assert list(stats["backends"]) == list(NAMES)
    assert all(b["reachable"] for b in stats["backends"].values())
    assert stats["requests"] == {"none": 1, "ngram-k2": 0, "ngram-k4": 2}
    assert list(stats["requests"]) == list(NAMES)
    assert stats["reasons"] == {"override": 3}
    structured = stats["workloads"]["structured"]
    assert structured["requests"] == {"none": 1, "ngram-k2": 0, "ngram-k4": 2}
    assert list(structured["requests"]) == list(NAMES)
    e2e = structured["e2e_mean_s"]
    assert list(e2e) == list(NAMES) and e2e["ngram-k2"] is None
    assert e2e["none"] > 0 and e2e["ngram-k4"] > 0
    # Acceptance per speculative route, its own k, believed as the policy holds it.
    policy = gateway.app[RUNTIME].current.policy
    believed = policy.estimated_acceptance()
    for workload in Workload:
        acceptance = stats["workloads"][workload.value]["acceptance"]
        assert list(acceptance) == list(SPECULATIVE)
        for name in SPECULATIVE:
            a = acceptance[name]
            assert a["num_speculative_tokens"] == K[name]
            alpha = believed.get(Route(name), {}).get(workload)
            want = None if alpha is None else round(acceptance_rate(alpha, K[name]), 4)
            assert a["believed_rate"] == want, (workload, name)
            assert a["measured_requests"] == 0 and a["measured_rate"] is None  # fakes: none


async def test_stats_measures_acceptance_on_each_speculative_route_apart(
    tokens: TokenCounter,
) -> None:
    """Emulated servers with per-request metrics: what each route measured is its own."""
    async with (
        three_route_stack(time_scale=0.05, tokens=tokens) as stack,
        aiohttp.ClientSession() as session,
    ):
        await profiled(session, stack.gateway)  # each route's probes: a belief per route
        for route in ("ngram-k2", "ngram-k4", "ngram-k4", "none"):
            async with session.post(
                f"{stack.gateway}/v1/chat/completions",
                json={**STRUCTURED, "model": "emulated-model", "stream": True},
                headers={"x-specroute-route": route},
            ) as resp:
                assert resp.status == 200
                assert resp.headers["x-specroute-route"] == route
                await resp.read()
        async with session.get(f"{stack.gateway}/stats") as resp:
            assert resp.status == 200
            stats = await resp.json()
    conforms(stats, "Stats")
    structured = stats["workloads"]["structured"]
    assert structured["requests"] == {"none": 1, "ngram-k2": 1, "ngram-k4": 2}
    acceptance = structured["acceptance"]
    assert {name: a["measured_requests"] for name, a in acceptance.items()} == {
        "ngram-k2": 1,
        "ngram-k4": 2,
    }
    for a in acceptance.values():
        assert 0 <= a["measured_rate"] <= 1  # a short answer may accept no draft
        assert a["sources"] == ["per_request_metrics"]
    assert all(b["healthy"] for b in stats["backends"].values())


async def test_stats_believes_each_speculative_route_with_its_own_k(
    tokens: TokenCounter,
) -> None:
    """After the profile's probes the policy believes a per route and workload; /stats
    gives it as accepted / drafted tokens with that route's k, not another's."""
    async with (
        three_route_stack(time_scale=0.05, tokens=tokens) as stack,
        aiohttp.ClientSession() as session,
    ):
        await profiled(session, stack.gateway)
        async with session.get(f"{stack.gateway}/stats") as resp:
            stats = await resp.json()
        believed = stack.app[RUNTIME].current.policy.estimated_acceptance()
    conforms(stats, "Stats")
    acceptance = stats["workloads"]["structured"]["acceptance"]
    assert list(acceptance) == list(SPECULATIVE)
    for name in SPECULATIVE:
        alpha = believed[Route(name)][Workload.STRUCTURED]
        want = round(acceptance_rate(alpha, K[name]), 4)
        assert acceptance[name]["believed_rate"] == want
        assert acceptance[name]["num_speculative_tokens"] == K[name]
    # Read with the other route's k, the same a would be another rate: the check above
    # tells the right k from the wrong one.
    alpha = believed[Route("ngram-k4")][Workload.STRUCTURED]
    assert round(acceptance_rate(alpha, 2), 4) != acceptance["ngram-k4"]["believed_rate"]


async def profiled(session: aiohttp.ClientSession, gateway: str) -> None:
    """Until the gateway's start-up profile of every route is in use."""

    async def in_use() -> bool:
        async with session.get(f"{gateway}/stats") as resp:
            return bool((await resp.json())["profile"]["in_use"])

    await wait_until(in_use, "the profile of every route", timeout_s=60, interval_s=0.1)
