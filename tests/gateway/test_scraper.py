"""Scraping vLLM's /metrics: the figures the router and the dashboards use."""

from __future__ import annotations

import math

from aiohttp import web
from aiohttp.test_utils import TestClient

from classifier.types import Route
from gateway.backends.scraper import acceptance_between, parse_metrics
from gateway.state import BACKENDS, SESSION
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_observability import samples

Client = TestClient[web.Request, web.Application]


def vllm_metrics(
    running: int, waiting: int, kv: float, drafts: int, drafted: int, accepted: int
) -> str:
    labels = 'engine="0",model_name="smollm2-135m"'
    return f"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{labels}}} {running}.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{labels}}} {waiting}.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{labels}}} {kv}
# TYPE vllm:request_success_total counter
vllm:request_success_total{{{labels},finished_reason="stop"}} 12.0
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}.0
vllm:spec_decode_num_drafts_created{{{labels}}} 1.7e+09
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{{labels}}} {drafted}.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="0"}} 5.0
"""


def test_parse_reads_load_and_counters() -> None:
    scrape = parse_metrics(vllm_metrics(3, 1, 0.25, 10, 40, 30), at=1.0)
    assert (scrape.running, scrape.waiting, scrape.kv_usage) == (3, 1, 0.25)
    assert (scrape.drafts, scrape.draft_tokens, scrape.accepted_tokens) == (10, 40, 30)


def test_parse_sums_engines_and_keeps_fullest_kv() -> None:
    text = (
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 3\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m with space"} 0.7\n'
    )
    scrape = parse_metrics(text, at=0.0)
    assert scrape.running == 5 and scrape.kv_usage == 0.7
    assert scrape.draft_tokens is None  # a baseline server has no spec counters


def test_acceptance_is_the_counter_delta() -> None:
    before = parse_metrics(vllm_metrics(0, 0, 0, 10, 40, 30), at=0.0)
    after = parse_metrics(vllm_metrics(0, 0, 0, 20, 80, 50), at=2.0)
    window = acceptance_between(before, after)
    assert window is not None
    assert window.rate == 20 / 40
    assert window.mean_length == 1 + 20 / 10
    assert acceptance_between(after, after) is None  # no new drafts
    restarted = parse_metrics(vllm_metrics(0, 0, 0, 1, 4, 1), at=3.0)
    assert acceptance_between(after, restarted) is None


async def test_gateway_exports_scraped_state_and_feeds_the_router(
    gateway: Client, spec_upstream: FakeUpstream
) -> None:
    pool = gateway.app[BACKENDS]
    session = gateway.app[SESSION]
    spec_upstream.metrics_text = vllm_metrics(5, 2, 0.5, 10, 40, 30)
    await pool.scrape_all(session, timeout_s=1.0)
    spec_upstream.metrics_text = vllm_metrics(6, 0, 0.6, 30, 120, 90)
    await pool.scrape_all(session, timeout_s=1.0)
    state = pool.live_state()
    assert (state.of(Route.SPECULATIVE).running, state.of(Route.SPECULATIVE).waiting) == (6, 0)
    assert state.of(Route.SPECULATIVE).kv_cache_usage == 0.6
    assert state.of(Route.BASELINE).running is None  # baseline fake has no /metrics: unknown, not 0

    m = samples(await (await gateway.get("/metrics")).text())
    spec = (("route", "speculative"),)
    assert m[("specroute_backend_running", spec)] == 6
    assert m[("specroute_backend_kv_cache_usage_ratio", spec)] == 0.6
    assert m[("specroute_backend_spec_acceptance_ratio", spec)] == 60 / 80
    assert m[("specroute_backend_spec_mean_acceptance_length", spec)] == 1 + 60 / 20
    assert math.isnan(m[("specroute_backend_running", (("route", "baseline"),))])
    errors = m[("specroute_upstream_errors_total", (("kind", "scrape"), ("route", "baseline")))]
    assert errors >= 2


async def test_spec_kv_pressure_from_scrape_sends_structured_to_baseline(
    gateway: Client, spec_upstream: FakeUpstream
) -> None:
    spec_upstream.metrics_text = vllm_metrics(1, 0, 0.97, 0, 0, 0)
    await gateway.app[BACKENDS].scrape_all(gateway.app[SESSION], timeout_s=1.0)
    body = {
        "messages": [{"role": "user", "content": "Give JSON"}],
        "temperature": 0,
        "response_format": {"type": "json_object"},
    }
    resp = await gateway.post("/v1/chat/completions", json=body)
    assert resp.headers["x-specroute-route"] == "baseline"
    assert resp.headers["x-specroute-reason"] == "kv-pressure"
