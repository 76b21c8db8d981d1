"""Acceptance from vLLM's counters when the speculative server sends no per-request
metrics: attributed per workload off the request path, used in the order
per-request metrics > counter attribution > streamed steps, and labelled."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from classifier.attribution import DecodeLog
from classifier.features import Workload
from classifier.router import ProfiledPolicy
from classifier.speculation import acceptance_rate
from classifier.types import Route
from gateway.app import create_app
from gateway.backends.acceptance_sources import AcceptanceSources
from gateway.backends.pool import BackendPool, Upstream
from gateway.backends.scraper import Scrape
from gateway.state import BACKENDS, RUNTIME, SESSION
from gateway.telemetry import Metrics
from gateway.wire.acceptance import COUNTER_ATTRIBUTION, PER_REQUEST_METRICS, STREAM_STEPS, UNKNOWN
from tests.gateway.conftest import ClientFactory, GatewayFactory, ServerFactory, make_config
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_measure import VLLM_REPORT
from tests.gateway.test_observability import samples
from tests.gateway.test_routing import chat
from tests.support import wait_until

Client = TestClient[web.Request, web.Application]
SPEC = {"x-specroute-route": "speculative"}
QUIET = {"upstream": {"scrape_interval_s": 3600.0}}  # one background scrape, at start


def spec_metrics(drafted: int, accepted: int, *, running: int = 0, created: float = 1.7e9) -> str:
    labels = 'engine="0",model_name="fake-model"'
    return f"""# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{labels}}} {running}.0
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{{labels}}} {drafted // 4}.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{{labels}}} {drafted}.0
vllm:spec_decode_num_draft_tokens_created{{{labels}}} {created}
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}.0
"""


def spec_upstream_of(client: Client) -> Upstream:
    return next(b for b in client.app[BACKENDS] if b.route.value == "speculative").upstreams[0]


async def started(client: Client) -> BackendPool:
    """The pool, once the background scraper's first scrape (the baseline) is in."""
    await wait_until(lambda: spec_upstream_of(client).scrape is not None, "the first scrape")
    return client.app[BACKENDS]


async def attribute_one_window(
    client: Client, upstream: FakeUpstream, drafted: int, accepted: int, body: dict[str, Any]
) -> None:
    """One request in flight across one scrape window whose counters moved by
    drafted/accepted: with nobody else decoding, all of it is that request's."""
    pool = await started(client)
    upstream.chunk_delay_s = 0.05
    upstream.arrived.clear()
    task = asyncio.ensure_future(client.post("/v1/chat/completions", json=body, headers=SPEC))
    await wait_until(upstream.arrived.is_set, "the request to reach the upstream")
    # running=0: the window is the request's whether or not it has ended when the
    # scrape lands (on a slow machine it may have; then vLLM would say 0 too).
    upstream.metrics_text = spec_metrics(drafted, accepted)
    await pool.scrape_all(client.app[SESSION], timeout_s=5.0)
    await (await task).read()
    upstream.chunk_delay_s = 0.0


async def test_one_request_in_flight_is_exact_and_feeds_later_answers(
    gateway_for: GatewayFactory, spec_upstream: FakeUpstream
) -> None:
    spec_upstream.metrics_text = spec_metrics(0, 0)
    gateway = await gateway_for(**QUIET, routing={"policy": "profiled"})
    policy = gateway.app[RUNTIME].current.policy
    assert isinstance(policy, ProfiledPolicy)
    assert Workload.CHAT not in policy.acceptance_beliefs()  # no probe, no answer yet
    await attribute_one_window(gateway, spec_upstream, 4000, 3000, chat("hi"))

    m = samples(await (await gateway.get("/metrics")).text())
    assert (
        m[
            (
                "specroute_attributed_acceptance_ratio",
                (("route", "speculative"), ("workload", "chat")),
            )
        ]
        == 0.75
    )
    assert m[
        ("specroute_attributed_draft_tokens", (("route", "speculative"), ("workload", "chat")))
    ] == pytest.approx(4000, rel=0.03)
    assert math.isnan(
        m[
            (
                "specroute_attributed_acceptance_ratio",
                (("route", "speculative"), ("workload", "code")),
            )
        ]
    )
    outcome = (("outcome", "attributed"), ("route", "speculative"))
    assert m[("specroute_attribution_windows_total", outcome)] == 1

    # The next answers without per-request metrics take the workload's attributed
    # rate, streams included (before their own streamed-step estimate).
    with capture_logs() as logs:
        for stream in (False, True):
            resp = await gateway.post(
                "/v1/chat/completions", json=chat("hi", stream=stream), headers=SPEC
            )
            await resp.read()
    lines = [e for e in logs if e["event"] == "request"]
    assert [(e["acceptance_source"], e["acceptance"], e["acceptance_length"]) for e in lines] == [
        (COUNTER_ATTRIBUTION, 0.75, 4.0),  # 1 + 0.75 x k=4 tokens per verify step
        (COUNTER_ATTRIBUTION, 0.75, 4.0),
    ]
    m = samples(await (await gateway.get("/metrics")).text())
    key = (("route", "speculative"), ("source", COUNTER_ATTRIBUTION), ("workload", "chat"))
    assert m[("specroute_spec_acceptance_ratio_count", key)] >= 2
    assert m[("specroute_acceptance_source", (("source", COUNTER_ATTRIBUTION),))] == 1
    assert m[("specroute_acceptance_source", (("source", UNKNOWN),))] == 0
    # The router learned from it: chat's acceptance left its neutral prior (a = 0.5: a
    # rate of 0.23 at k=4), upwards.
    rate, _, measured = policy.acceptance_beliefs()[Route.SPECULATIVE][Workload.CHAT]
    assert rate > acceptance_rate(0.5, 4) + 0.1 and measured > 0
    ready = await (await gateway.get("/ready")).json()
    assert ready["per_request_metrics"] is False
    assert ready["acceptance_source"] == COUNTER_ATTRIBUTION


async def test_before_the_attribution_has_evidence_streams_fall_back_to_their_steps(
    gateway_for: GatewayFactory, spec_upstream: FakeUpstream
) -> None:
    spec_upstream.metrics_text = spec_metrics(0, 0)
    with capture_logs() as logs:
        gateway = await gateway_for(**QUIET)
        await started(gateway)
        ready = await (await gateway.get("/ready")).json()
        assert (ready["per_request_metrics"], ready["acceptance_source"]) == (None, UNKNOWN)
        for stream in (False, True):
            resp = await gateway.post(
                "/v1/chat/completions", json=chat("hi", stream=stream), headers=SPEC
            )
            await resp.read()
    requests = [e for e in logs if e["event"] == "request"]
    assert [e["acceptance_source"] for e in requests] == [None, STREAM_STEPS]
    # Said at start, and again at the first evidence.
    said = [
        (e["source"], e["per_request_metrics"]) for e in logs if e["event"] == "acceptance_source"
    ]
    assert said == [(UNKNOWN, None), (STREAM_STEPS, False)]
    ready = await (await gateway.get("/ready")).json()
    assert (ready["per_request_metrics"], ready["acceptance_source"]) == (False, STREAM_STEPS)


@dataclass
class ReportingUpstream(FakeUpstream):
    """Answers like vLLM with --per-request-spec-decode-metrics."""

    def _whole(self, chat: bool, words: list[str], usage: dict[str, int]) -> dict[str, Any]:
        return {**super()._whole(chat, words, usage), **VLLM_REPORT}


async def test_per_request_metrics_come_first(
    aiohttp_server: ServerFactory,
    aiohttp_client: ClientFactory,
    base_server: Any,
    tokens: Any,
) -> None:
    upstream = ReportingUpstream("speculative", metrics_text=spec_metrics(0, 0))
    spec_server = await aiohttp_server(upstream.app())
    config = make_config(str(spec_server.make_url("")), str(base_server.make_url("")), **QUIET)
    gateway = await aiohttp_client(create_app(config, tokens=tokens))
    await attribute_one_window(gateway, upstream, 4000, 3000, chat("hi"))
    with capture_logs() as logs:
        await (await gateway.post("/v1/chat/completions", json=chat("hi"), headers=SPEC)).read()
    line = next(e for e in logs if e["event"] == "request")
    assert (line["acceptance_source"], line["acceptance"]) == (PER_REQUEST_METRICS, 0.375)
    ready = await (await gateway.get("/ready")).json()
    assert (ready["per_request_metrics"], ready["acceptance_source"]) == (True, PER_REQUEST_METRICS)
    # The attribution still ran (it is what benchmarks/attribution_error.py measures).
    assert gateway.app[BACKENDS].sources.attributed_rate(Route.SPECULATIVE, Workload.CHAT) == 0.75


async def test_counter_resets_are_detected_not_read_as_negative_acceptance(
    gateway_for: GatewayFactory, spec_upstream: FakeUpstream
) -> None:
    spec_upstream.metrics_text = spec_metrics(0, 0)
    gateway = await gateway_for(**QUIET)
    await attribute_one_window(gateway, spec_upstream, 4000, 3000, chat("hi"))
    pool, session = gateway.app[BACKENDS], gateway.app[SESSION]
    # A vLLM restart: counters back near zero...
    spec_upstream.metrics_text = spec_metrics(400, 10, created=1.8e9)
    await pool.scrape_all(session, timeout_s=5.0)
    # ...or already past the old values by the next scrape, but created anew.
    spec_upstream.metrics_text = spec_metrics(9000, 100, created=1.9e9)
    await pool.scrape_all(session, timeout_s=5.0)
    m = samples(await (await gateway.get("/metrics")).text())
    assert (
        m[
            (
                "specroute_attribution_windows_total",
                (("outcome", "reset"), ("route", "speculative")),
            )
        ]
        == 2
    )
    assert (
        m[
            (
                "specroute_attributed_acceptance_ratio",
                (("route", "speculative"), ("workload", "chat")),
            )
        ]
        == 0.75
    )
    assert m[("specroute_backend_spec_acceptance_ratio", (("route", "speculative"),))] == 0.75


@dataclass
class SlowMetricsUpstream(FakeUpstream):
    metrics_delay_s: float = 0.0

    async def _metrics(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.metrics_delay_s)
        return await super()._metrics(request)


async def test_a_failed_or_hanging_scrape_blocks_no_request_and_teaches_nothing(
    aiohttp_server: ServerFactory,
    aiohttp_client: ClientFactory,
    base_server: Any,
    tokens: Any,
) -> None:
    upstream = SlowMetricsUpstream("speculative", metrics_text=spec_metrics(0, 0))
    spec_server = await aiohttp_server(upstream.app())
    config = make_config(str(spec_server.make_url("")), str(base_server.make_url("")), **QUIET)
    gateway = await aiohttp_client(create_app(config, tokens=tokens))
    pool, session = await started(gateway), gateway.app[SESSION]
    upstream.metrics_delay_s = 60.0
    upstream.metrics_text = spec_metrics(4000, 3000, running=1)
    hanging = asyncio.ensure_future(pool.scrape_all(session, timeout_s=60.0))
    try:
        for stream in (False, True):
            resp = await asyncio.wait_for(
                gateway.post("/v1/chat/completions", json=chat("hi", stream=stream), headers=SPEC),
                timeout=5.0,
            )
            assert resp.status == 200
            await resp.read()
    finally:
        hanging.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hanging
    upstream.metrics_delay_s, upstream.metrics_text = 0.0, ""  # now failing: 404
    await pool.scrape_all(session, timeout_s=5.0)
    assert pool.sources.attributed_rate(Route.SPECULATIVE, Workload.CHAT) is None
    m = samples(await (await gateway.get("/metrics")).text())
    assert (
        m[("specroute_upstream_errors_total", (("kind", "scrape"), ("route", "speculative")))] == 1
    )
    assert not any(name == "specroute_attribution_windows_total" for name, _ in m)


def _scrape(at: float, drafted: float, accepted: float, running: float = 1.0) -> Scrape:
    return Scrape(at=at, running=running, draft_tokens=drafted, accepted_tokens=accepted)


@pytest.mark.parametrize(
    ("after", "decoding", "outcome"),
    [
        (_scrape(2.0, 4000, 1500), True, "attributed"),
        (_scrape(2.0, 4000, 3000), False, "unattributed"),  # drafts, none of ours decoding
        (_scrape(2.0, 4000, 3000, running=3), True, "foreign"),  # someone else's requests
        (_scrape(30.0, 4000, 3000), True, "stale"),  # a failed scrape in between: too long
        (_scrape(2.0, 1000, 0), True, "reset"),
        (_scrape(2.0, 2000, 1000), True, "no_drafts"),
    ],
)
def test_which_windows_are_attributed(after: Scrape, decoding: bool, outcome: str) -> None:
    sources = AcceptanceSources(Metrics(), max_window_s=6.0, speculative={Route.SPECULATIVE: 4})
    log = DecodeLog()
    if decoding:
        log.begin("code", 1, 0.5)
    assert (
        sources.window(Route.SPECULATIVE, _scrape(1.0, 2000, 1000), after, log, inflight=1)
        == outcome
    )
    attributed = sources.attributed_rate(Route.SPECULATIVE, Workload.CODE)
    assert attributed == (0.25 if outcome == "attributed" else None)
