"""A host with N GPUs runs a pair per GPU (backends.pairs = "by-index"): a request goes
to the least loaded pair, the route is decided within it, and its batch stays on
one of that pair's servers.

Before, all URLs of a route were one backend: the least busy speculative server
took a speculative request whichever GPU it was on, failover went to any
baseline server, and one consolidation target and topology verdict stood for
the whole host.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.config import parse_config
from tests.gateway.conftest import ClientFactory, ServerFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_routing import chat
from tests.support import wait_until
from tooling.bench.targets import wait_for_profile
from tooling.loadgen import run_closed_loop
from tooling.local_stack import MODEL, local_stack
from tooling.workloads import MIXES, build

Client = TestClient[web.Request, web.Application]
FORCE = "x-specroute-route"


class TwoPairs:
    """Four fake servers: speculative i and baseline i share GPU i."""

    def __init__(self) -> None:
        self.spec = [FakeUpstream("speculative-0"), FakeUpstream("speculative-1")]
        self.base = [FakeUpstream("baseline-0"), FakeUpstream("baseline-1")]
        self.urls: dict[str, list[str]] = {}

    def served(self) -> dict[str, int]:
        return {u.name: len(u.received) for u in (*self.spec, *self.base)}


@pytest.fixture
async def pairs(aiohttp_server: ServerFactory) -> TwoPairs:
    fakes = TwoPairs()
    for route, upstreams in (("speculative", fakes.spec), ("baseline", fakes.base)):
        servers: list[TestServer] = [await aiohttp_server(u.app()) for u in upstreams]
        fakes.urls[route] = [str(s.make_url("")) for s in servers]
    return fakes


async def paired_gateway(
    aiohttp_client: ClientFactory, pairs: TwoPairs, tokens: TokenCounter
) -> Client:
    config = parse_config(
        {
            "backends": {
                "pairs": "by-index",
                "speculative": {"urls": pairs.urls["speculative"]},
                "baseline": {"urls": pairs.urls["baseline"]},
            },
            "upstream": {"health_interval_s": 0.1, "connect_timeout_s": 1.0},
            "routing": {"policy": "rules"},
        }
    )
    return await aiohttp_client(create_app(config, tokens=tokens))


async def hold_one_on_pair_0(gateway: Client, pairs: TwoPairs) -> asyncio.Task[Any]:
    """A slow answer from baseline 0, in flight until the task is awaited."""
    pairs.base[0].chunk_delay_s = 0.3

    async def slow() -> bytes:
        resp = await gateway.post(
            "/v1/chat/completions", json=chat("slow", stream=True), headers={FORCE: "baseline"}
        )
        return await resp.read()

    task = asyncio.create_task(slow())
    await asyncio.wait_for(pairs.base[0].arrived.wait(), 5)
    return task


async def decided_pair(gateway: Client) -> tuple[int, dict[str, Any]]:
    resp = await gateway.post("/decide/v1/chat/completions", json=chat("hi"))
    assert resp.status == 200
    body = await resp.json()
    return body["pair"], body["backends"]


async def test_a_request_goes_to_the_least_loaded_pair_and_the_dry_run_agrees(
    aiohttp_client: ClientFactory, pairs: TwoPairs, tokens: TokenCounter
) -> None:
    gateway = await paired_gateway(aiohttp_client, pairs, tokens)
    assert (await decided_pair(gateway))[0] == 0  # a tie goes to the lower index
    slow = await hold_one_on_pair_0(gateway, pairs)
    pair, backends = await decided_pair(gateway)
    assert pair == 1  # one request in flight on pair 0
    assert backends["baseline"]["inflight"] == 0  # pair 1's endpoints only
    resp = await gateway.post("/v1/chat/completions", json=chat("hi"), headers={FORCE: "baseline"})
    assert resp.status == 200
    await slow
    assert pairs.served() == {
        "speculative-0": 0,
        "speculative-1": 0,
        "baseline-0": 1,
        "baseline-1": 1,
    }


async def test_failover_tries_the_other_route_within_the_pair(
    aiohttp_client: ClientFactory, pairs: TwoPairs, tokens: TokenCounter
) -> None:
    """Pair 1's speculative server answers 503: its GPU-mate, baseline 1, answers.
    Before, a speculative request went to speculative 0 (the least busy of the
    route) and never met pair 1's failure, nor its pair."""
    pairs.spec[1].fail_status = 503
    gateway = await paired_gateway(aiohttp_client, pairs, tokens)
    slow = await hold_one_on_pair_0(gateway, pairs)
    resp = await gateway.post(
        "/v1/chat/completions", json=chat("hi"), headers={FORCE: "speculative"}
    )
    assert resp.status == 200
    assert resp.headers["x-specroute-route"] == "baseline"
    assert resp.headers["x-specroute-failover"] == "speculative"
    await slow
    assert pairs.served() == {
        "speculative-0": 0,
        "speculative-1": 1,
        "baseline-0": 1,
        "baseline-1": 1,
    }


async def test_a_pair_with_no_healthy_endpoint_is_skipped(
    aiohttp_client: ClientFactory, pairs: TwoPairs, tokens: TokenCounter
) -> None:
    pairs.spec[0].healthy = pairs.base[0].healthy = False
    gateway = await paired_gateway(aiohttp_client, pairs, tokens)
    await wait_until(lambda: pairs.spec[0].health_calls > 1, "pair 0 probed")
    assert (await decided_pair(gateway))[0] == 1
    for route in ("speculative", "baseline"):
        resp = await gateway.post("/v1/chat/completions", json=chat("hi"), headers={FORCE: route})
        assert resp.status == 200
    assert pairs.served() == {
        "speculative-0": 0,
        "speculative-1": 1,
        "baseline-0": 0,
        "baseline-1": 1,
    }


# Over two emulated pairs (four emulated vLLM servers, each pair on its own
# emulated GPU), the cost model as shipped: it is not told the topology. The time
# scale is 0.25 so that the modelled GPU time, not this machine's CPU, is measured.
TIME_SCALE = 0.25
REQUESTS = build(MIXES["mixed"], 32, model=MODEL, seed=21)  # 192 requests


async def answered(session: aiohttp.ClientSession, url: str) -> int:
    """Requests the emulated server finished (vllm:request_success_total)."""
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return round(
        sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "vllm:request_success_total"
        )
    )


def in_start_order(lines: list[dict[str, Any]], pair: int) -> list[dict[str, Any]]:
    """A pair's requests in the order they were sent (the log is in finishing order)."""
    return sorted((d for d in lines if d["pair"] == pair), key=lambda d: d["ts"] - d["duration_s"])


@pytest.mark.slow
async def test_two_emulated_pairs_at_concurrency_8_consolidate_per_pair(
    tokens: TokenCounter, tmp_path: Path
) -> None:
    """(a) both pairs get load, (b) under load each pair's batch stays on one of its
    servers (it moves whole, when its followers are cheaper on the other), (c) no request
    fails. The outcome log says which pair each request was decided for; the four
    servers' own counters agree."""
    outcomes = tmp_path / "outcomes.jsonl"
    async with (
        local_stack(
            time_scale=TIME_SCALE,
            tokens=tokens,
            pairs=2,
            outcome_log={"path": str(outcomes)},
        ) as stack,
        aiohttp.ClientSession() as session,
    ):
        await wait_for_profile(aiohttp.ClientSession, stack.gateway, sys.stdout)
        servers = [
            ((pair, route), url)
            for pair, urls in enumerate(stack.pairs)
            for route, url in zip(("speculative", "baseline"), urls, strict=True)
        ]
        probes = {key: await answered(session, url) for key, url in servers}  # the profile's
        results = await run_closed_loop(session, stack.gateway, REQUESTS, 8)
        served = {key: await answered(session, url) - probes[key] for key, url in servers}
        async with session.get(f"{stack.gateway}/metrics") as resp:
            exported = await resp.text()
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]  # (c)
    lines = [json.loads(line) for line in outcomes.read_text().splitlines()]
    assert {d["status"] for d in lines} == {"2xx"} and len(lines) == len(REQUESTS)
    assert Counter((d["pair"], d["route"]) for d in lines) == +Counter(served)
    report = {}
    for pair in (0, 1):
        mine = in_start_order(lines, pair)
        assert len(mine) >= len(REQUESTS) // 4  # (a)
        reasons = Counter(d["reason"] for d in mine)
        # (b) under load a pair's batch lives on one of its servers: a request goes where
        # the one before it went, but for a few (a move of the batch, an idle GPU's choice)
        kept = [d["route"] for d in mine]
        moves = sum(a != b for a, b in itertools.pairwise(kept))
        assert moves <= 0.1 * len(kept), "".join(r[0] for r in kept)
        report[pair] = (dict(Counter(d["route"] for d in mine)), moves, dict(reasons))
    print(f"per pair (routes, moves of the batch, reasons): {report}")
    shared = {
        s.labels["pair"]
        for family in text_string_to_metric_families(exported)
        for s in family.samples
        if family.name == "specroute_gpu_shared"
    }
    assert shared == {"0", "1"}
