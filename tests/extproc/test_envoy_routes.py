"""Pool mode with three routes (none, ngram-k2, ngram-k4): Envoy on the N-route form of
deploy/envoy/envoy.yaml (one cluster per route, named as the route), the picker on
[routes.NAME] tables. Each named route reaches its own server; a dead one fails over
to the others; a request the picker never saw takes the default route."""

from __future__ import annotations

import aiohttp

from tests.extproc.conftest import THREE_ROUTES, RoutesFactory, RoutesStack
from tests.support import wait_until
from tooling.envoy import chat, emulator_state, envoy_stat, metric

SLOW_PROBES = {"health_interval_s": 30.0, "scrape_interval_s": 30.0}  # Envoy notices first


async def _settled(stack: RoutesStack) -> None:
    await wait_until(
        lambda: stack.picker.picker.streams == 0, "every gRPC stream closed", timeout_s=5
    )


async def test_each_named_route_reaches_its_own_server(routes_stack_for: RoutesFactory) -> None:
    stack = await routes_stack_for()
    async with aiohttp.ClientSession() as s:
        for route in THREE_ROUTES:
            headers = {"x-specroute-route": route}
            url = f"{stack.envoy.url}/v1/chat/completions"
            async with s.post(url, json=chat(), headers=headers) as r:
                assert r.status == 200
                assert r.headers["x-specroute-route"] == route
                body = await r.json()
            drafted = (body.get("metrics") or {}).get("speculative_decoding") or {}
            # The server of that route answered: it drafts the route's k per step.
            assert drafted.get("num_spec_tokens", 0) == THREE_ROUTES[route], route
    await _settled(stack)
    picker = stack.picker.http_url
    for route, url in stack.urls.items():
        assert (await emulator_state(url))["submitted"] == 1, route
        assert await metric(picker, "specroute_requests_total", route=route, status="2xx") == 1
        assert await envoy_stat(stack.envoy.admin, f"cluster.{route}.upstream_rq_total") == 1


async def test_the_policy_chooses_among_three_routes(routes_stack_for: RoutesFactory) -> None:
    """The rules: speculate (the first speculative route) or not (the first without)."""
    stack = await routes_stack_for()
    async with aiohttp.ClientSession() as s:
        url = f"{stack.envoy.url}/v1/chat/completions"
        async with s.post(url, json=chat(temperature=1.5)) as r:
            assert (r.headers["x-specroute-route"], r.headers["x-specroute-reason"]) == (
                "none",
                "high-temperature",
            )
            await r.read()
        async with s.post(url, json=chat()) as r:
            # The rules' default: speculate, on the first speculative route.
            assert (r.headers["x-specroute-route"], r.headers["x-specroute-reason"]) == (
                "ngram-k2",
                "default",
            )
            chosen = r.headers["x-specroute-route"]
            await r.read()
    await _settled(stack)
    served = {route: (await emulator_state(u))["submitted"] for route, u in stack.urls.items()}
    assert served["none"] >= 1 and sum(served.values()) == 2
    assert served[chosen] >= 1


async def test_a_dead_route_fails_over_to_the_others(routes_stack_for: RoutesFactory) -> None:
    """Its cluster holds every other route's servers at priority 1."""
    stack = await routes_stack_for(upstream=SLOW_PROBES)
    await stack.kill("ngram-k4")
    async with aiohttp.ClientSession() as s:
        for _ in range(4):
            headers = {"x-specroute-route": "ngram-k4"}
            url = f"{stack.envoy.url}/v1/chat/completions"
            async with s.post(url, json=chat(), headers=headers) as r:
                assert r.status == 200
                assert r.headers["x-specroute-route"] in ("none", "ngram-k2")
                assert r.headers["x-specroute-failover"] == "ngram-k4"
                await r.read()
    await _settled(stack)
    picker = stack.picker.http_url
    assert await metric(picker, "specroute_failovers_total", from_route="ngram-k4") == 4
    others = [(await emulator_state(stack.urls[r]))["submitted"] for r in ("none", "ngram-k2")]
    assert sum(others) == 4


async def test_without_the_picker_requests_take_the_default_route(
    routes_stack_for: RoutesFactory,
) -> None:
    """A path the picker does not route carries no route header: the default route."""
    stack = await routes_stack_for()
    async with aiohttp.ClientSession() as s, s.get(f"{stack.envoy.url}/v1/models") as r:
        assert r.status == 200
        await r.read()
    assert await envoy_stat(stack.envoy.admin, "cluster.none.upstream_rq_total") >= 1
    assert await envoy_stat(stack.envoy.admin, "cluster.ngram-k2.upstream_rq_total") == 0
