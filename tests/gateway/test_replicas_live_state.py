"""Two gateway replicas in front of one shared-GPU pair agree on which server carries the
batch, given the same scrape (gateway/backends/live.py). Deterministic: each replica holds its
own requests in flight, both scrape the same two fake vLLM servers, and the live
state each would decide on is compared; no timing is measured (benchmarks/replicas.py
measures the effect)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from aiohttp import web
from aiohttp.test_utils import TestClient

from classifier.features import Endpoint, extract_features
from classifier.tokens import TokenCounter
from classifier.types import Route
from gateway.request.pipeline import live_state
from gateway.state import BACKENDS, RUNTIME, SESSION
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_scraper import vllm_metrics

Client = TestClient[web.Request, web.Application]
# The profiled policy on its prior (beside 2: one shared GPU), without profiling the fakes.
PROFILED = {"policy": "profiled", "profile": "off"}


@contextlib.contextmanager
def in_flight(gateway: Client, route: Route, n: int) -> Iterator[None]:
    """`n` of this replica's requests in flight on `route`, as a forwarded request counts."""
    pool = gateway.app[BACKENDS]
    backend = pool.of(route)
    with contextlib.ExitStack() as held:
        for _ in range(n):
            held.enter_context(pool.track(backend, backend.upstreams[0]))
        yield


def servers_carry(spec: FakeUpstream, base: FakeUpstream, spec_load: int, base_load: int) -> None:
    """What the two fake vLLM servers' /metrics say they run (nothing waiting)."""
    spec.metrics_text = vllm_metrics(spec_load, 0, 0.1, 0, 0, 0)
    base.metrics_text = vllm_metrics(base_load, 0, 0.1, 0, 0, 0)


async def scrape(gateway: Client) -> None:
    await gateway.app[BACKENDS].scrape_all(gateway.app[SESSION], timeout_s=1.0)


async def test_two_replicas_see_one_batch_from_the_same_scrape(
    gateway_for: GatewayFactory,
    spec_upstream: FakeUpstream,
    base_upstream: FakeUpstream,
    tokens: TokenCounter,
) -> None:
    # The batch split: replica A sent 3 to the speculative server, B sent 2 to the baseline.
    servers_carry(spec_upstream, base_upstream, 3, 2)
    a, b = await gateway_for(routing=PROFILED), await gateway_for(routing=PROFILED)
    with in_flight(a, Route.SPECULATIVE, 3), in_flight(b, Route.BASELINE, 2):
        for _ in range(2):  # the other's batch is still there a scrape later
            await scrape(a)
            await scrape(b)
        # Each replica's own view: it holds the batch where its own newest request went.
        own_a, own_b = a.app[BACKENDS].live_state(0), b.app[BACKENDS].live_state(0)
        assert own_a.of(Route.SPECULATIVE).last_start > own_a.of(Route.BASELINE).last_start == 0
        assert own_b.of(Route.BASELINE).last_start > own_b.of(Route.SPECULATIVE).last_start == 0
        assert (own_b.of(Route.SPECULATIVE).inflight, own_b.of(Route.SPECULATIVE).others) == (0, 3)

        (_, seen_a), (_, seen_b) = live_state(a.app), live_state(b.app)
        assert seen_a == seen_b  # the same servers, whoever sent their requests
        for route, load in ((Route.SPECULATIVE, 3), (Route.BASELINE, 2)):
            backend = seen_a.of(route)
            assert (backend.inflight, backend.others, backend.last_start) == (load, 0, 0)
            assert backend.load == own_a.of(route).load  # the cost model's load unchanged

        body = {"messages": [{"role": "user", "content": "Write a short poem."}]}
        features = extract_features(body, Endpoint.CHAT, tokens)
        decisions = [
            g.app[RUNTIME].current.policy.decide(features, state)
            for g, state in ((a, seen_a), (b, seen_b))
        ]
        assert decisions[0].route == decisions[1].route  # one carrier for both replicas
        assert all(d.why and "followers_s" in d.why for d in decisions)  # a busy shared GPU


async def test_one_replica_alone_decides_on_its_own_counts(
    gateway_for: GatewayFactory, spec_upstream: FakeUpstream, base_upstream: FakeUpstream
) -> None:
    """No requests but its own on the servers: the state is the replica's own, unchanged."""
    servers_carry(spec_upstream, base_upstream, 2, 1)
    gateway = await gateway_for(routing=PROFILED)
    with in_flight(gateway, Route.SPECULATIVE, 2), in_flight(gateway, Route.BASELINE, 1):
        await scrape(gateway)
        _, seen = live_state(gateway.app)
        assert seen == gateway.app[BACKENDS].live_state(0)
        assert (seen.of(Route.SPECULATIVE).others, seen.of(Route.BASELINE).others) == (0, 0)
        assert seen.of(Route.BASELINE).last_start > seen.of(Route.SPECULATIVE).last_start > 0


async def test_a_scrape_that_lags_the_gateways_own_requests_is_not_another_client(
    gateway_for: GatewayFactory, spec_upstream: FakeUpstream, base_upstream: FakeUpstream
) -> None:
    """A lone gateway's requests ended, and one scrape still shows them: the pair stays
    idle to the decision; the same count a scrape later is someone else's."""
    gateway = await gateway_for(routing=PROFILED)
    servers_carry(spec_upstream, base_upstream, 0, 0)
    await scrape(gateway)
    servers_carry(spec_upstream, base_upstream, 2, 0)  # its own two, just finished
    await scrape(gateway)
    _, seen = live_state(gateway.app)
    assert seen == gateway.app[BACKENDS].live_state(0)  # its own counts, unchanged
    assert (seen.of(Route.SPECULATIVE).inflight, seen.of(Route.SPECULATIVE).others) == (0, 2)
    await scrape(gateway)  # still there: not the gateway's, lagging
    _, seen = live_state(gateway.app)
    assert (seen.of(Route.SPECULATIVE).inflight, seen.of(Route.SPECULATIVE).others) == (2, 0)


async def test_decide_dry_run_sees_what_a_request_would(
    gateway_for: GatewayFactory, spec_upstream: FakeUpstream, base_upstream: FakeUpstream
) -> None:
    """/decide reads the same live state as a request (the other replica's batch included)."""
    servers_carry(spec_upstream, base_upstream, 5, 0)
    gateway = await gateway_for(routing=PROFILED)
    await scrape(gateway)
    await scrape(gateway)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    resp = await gateway.post("/decide/v1/chat/completions", json=body)
    assert resp.status == 200
    seen = (await resp.json())["backends"]
    assert (seen["speculative"]["inflight"], seen["speculative"]["others"]) == (5, 0)
    assert (seen["baseline"]["inflight"], seen["baseline"]["others"]) == (0, 0)
