"""Scraping vLLM's /metrics: the figures the router and the dashboards use, and a
hostile server's figures and bodies, which never reach them."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from classifier.types import Route
from gateway.app import create_app
from gateway.backends.scraper import (
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    DRAFT_TOKENS_CREATED,
    DRAFTS,
    KV_USAGE,
    MAX_BODY_BYTES,
    RUNNING,
    SCRAPE_ERRORS,
    WAITING,
    Scrape,
    acceptance_between,
    check,
    parse_metrics,
    read_limited,
    scrape_once,
    supervised,
)
from gateway.state import BACKENDS, SESSION
from tests.gateway.conftest import ClientFactory, ServerFactory, make_config
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_counter_attribution import SlowMetricsUpstream
from tests.gateway.test_observability import samples
from tests.support import wait_until

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


BAD_FIGURES = {
    "nan": ('vllm:num_requests_running{engine="0"} NaN', "running", "non_finite"),
    "plus_inf": ('vllm:num_requests_waiting{engine="0"} +Inf', "waiting", "non_finite"),
    "minus_inf": ('vllm:spec_decode_num_drafts_total{engine="0"} -Inf', "drafts", "non_finite"),
    "negative": ('vllm:num_requests_running{engine="0"} -1', "running", "negative"),
    "kv_over_1": ('vllm:kv_cache_usage_perc{engine="0"} 1.0001', "kv_usage", "out_of_range"),
    "running_1e308": ("vllm:num_requests_running 1e308", "running", "out_of_range"),
    "not_a_number": ('vllm:num_requests_running{engine="0"} lots', "running", "malformed"),
    "no_value": ('vllm:num_requests_running{engine="0"}', "running", "malformed"),
    "unclosed_brace": ('vllm:num_requests_running{engine="0" 3', "running", "malformed"),
    "counters_overflow": (
        "vllm:spec_decode_num_draft_tokens_total 1.5e308\n" * 2,
        "draft_tokens",
        "non_finite",
    ),
}


@pytest.mark.parametrize(("line", "figure", "kind"), BAD_FIGURES.values(), ids=list(BAD_FIGURES))
def test_a_bad_figure_is_unknown_and_its_fault_named(line: str, figure: str, kind: str) -> None:
    """Before, NaN reached int() in the live state (a 500 on every routed request), and
    an unclosed `{` raised in the parser (the scraper task died)."""
    good = vllm_metrics(3, 1, 0.25, 10, 40, 30)
    scrape = parse_metrics(good + line + "\n", at=0.0)
    assert getattr(scrape, figure) is None
    assert scrape.problems == (kind,)
    # The figures the bad line is not about are kept.
    kept = {"running": 3, "waiting": 1, "kv_usage": 0.25, "drafts": 10, "draft_tokens": 40}
    for name, value in kept.items():
        if name != figure:
            assert getattr(scrape, name) == value, name


def test_a_figure_is_judged_once_per_scrape_and_the_sum_too() -> None:
    text = (
        'vllm:num_requests_running{engine="0"} NaN\n'
        'vllm:num_requests_running{engine="1"} -1\n'  # already thrown away: not counted
        'vllm:num_requests_waiting{engine="0"} 600000\n'
        'vllm:num_requests_waiting{engine="1"} 600000\n'  # each within bounds, the sum not
        'vllm:kv_cache_usage_perc{engine="0"} 0\n'
        'vllm:kv_cache_usage_perc{engine="1"} 1\n'  # the ceiling itself is fine
    )
    scrape = parse_metrics(text, at=0.0)
    assert (scrape.running, scrape.waiting, scrape.kv_usage) == (None, None, 1.0)
    assert scrape.problems == ("non_finite", "out_of_range")


@pytest.mark.parametrize("mode", ["speculative", "baseline"])
def test_a_real_vllm_scrape_has_no_fault_and_is_far_below_the_bound(mode: str) -> None:
    path = Path(__file__).parents[2] / "deploy" / "cpu" / "fixtures" / f"metrics_{mode}.txt"
    text = path.read_text()
    assert len(text.encode()) < MAX_BODY_BYTES / 100
    scrape = parse_metrics(text, at=0.0)
    assert scrape.problems == ()
    assert scrape.running is not None and scrape.kv_usage is not None
    assert (scrape.draft_tokens is not None) == (mode == "speculative")


# Each series read, and the Scrape field it fills.
FIGURES = {
    RUNNING: "running",
    WAITING: "waiting",
    KV_USAGE: "kv_usage",
    DRAFTS: "drafts",
    DRAFT_TOKENS: "draft_tokens",
    ACCEPTED_TOKENS: "accepted_tokens",
    DRAFT_TOKENS_CREATED: "counters_created",
}
# Lines that look like the series read, with anything after the name.
_TAILS = st.text(alphabet='{}",= \t.eE+-0123456789naifNIx#\\', max_size=40)
_LINES = st.one_of(
    st.builds(lambda name, tail: name + tail, st.sampled_from([*FIGURES, "vllm:"]), _TAILS),
    st.text(max_size=40),
)


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(_LINES, max_size=12))
def test_no_line_makes_the_parser_raise_or_a_bad_figure_pass(lines: list[str]) -> None:
    scrape = parse_metrics("\n".join(lines), at=0.0)
    for name, field in FIGURES.items():
        value = getattr(scrape, field)
        assert value is None or check(name, value) is None, (name, value)
    assert set(scrape.problems) <= set(SCRAPE_ERRORS)


def _body_app(body: bytes, *, chunked: bool) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        if not chunked:
            return web.Response(body=body)
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i in range(0, len(body), 100):
            await resp.write(body[i : i + 100])
        return resp

    app = web.Application()
    app.router.add_get("/", handle)
    return app


@pytest.mark.parametrize("chunked", [False, True], ids=["content_length", "chunked"])
async def test_a_body_past_its_bound_is_not_read(
    aiohttp_client: ClientFactory, chunked: bool
) -> None:
    """Before: resp.text() read all of it, however long (a body without end: 1.2 GB)."""
    client = await aiohttp_client(_body_app(b"x" * 1000, chunked=chunked))
    async with client.get("/") as resp:
        assert await read_limited(resp, 1000) == b"x" * 1000
    async with client.get("/") as resp:
        assert await read_limited(resp, 999) is None
        assert resp.closed


async def test_a_failed_scrape_says_why(
    aiohttp_server: ServerFactory, unused_tcp_port_factory: object
) -> None:
    missing = await aiohttp_server(FakeUpstream("x").app())  # no metrics_text: a 404
    slow = SlowMetricsUpstream("x", metrics_text="vllm:num_requests_running 1\n")
    slow.metrics_delay_s = 5.0
    slow_server = await aiohttp_server(slow.app())
    port = unused_tcp_port_factory()  # type: ignore[operator]
    async with aiohttp.ClientSession() as session:
        assert await scrape_once(session, str(missing.make_url("")), {}, 1.0) == "http_status"
        assert await scrape_once(session, f"http://127.0.0.1:{port}", {}, 1.0) == "unreachable"
        assert await scrape_once(session, str(slow_server.make_url("")), {}, 0.1) == "timeout"
        slow.metrics_delay_s = 0.0
        scrape = await scrape_once(session, str(slow_server.make_url("")), {}, 1.0)
        assert isinstance(scrape, Scrape) and scrape.running == 1


async def test_a_background_task_that_raises_is_logged_and_restarted() -> None:
    """Before: the scraper task died with its exception unseen until shutdown."""
    runs = 0
    restarted = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise ValueError("cannot convert float NaN to integer")
        restarted.set()
        await asyncio.Event().wait()

    with capture_logs() as logs:
        task = asyncio.create_task(supervised(flaky, 0.01, task="scraper", url="http://x"))
        await asyncio.wait_for(restarted.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    [line] = logs
    assert line["event"] == "background_task_failed" and line["log_level"] == "error"
    assert (line["task"], line["url"], line["exc_info"]) == ("scraper", "http://x", True)


async def test_a_slow_endpoint_delays_no_other_endpoints_scrapes(
    aiohttp_server: ServerFactory,
    aiohttp_client: ClientFactory,
    base_upstream: FakeUpstream,
    base_server: object,
    tokens: object,
) -> None:
    """Before: one scrape of every endpoint at once, so each waited for the slowest
    (up to the scrape timeout) before the next round."""
    slow = SlowMetricsUpstream("speculative", metrics_text=vllm_metrics(1, 0, 0.1, 0, 0, 0))
    slow.metrics_delay_s = 60.0
    spec_server = await aiohttp_server(slow.app())
    base_upstream.metrics_text = vllm_metrics(2, 0, 0.2, 0, 0, 0)
    config = make_config(
        str(spec_server.make_url("")),
        str(base_server.make_url("")),  # type: ignore[attr-defined]
        upstream={"scrape_interval_s": 0.05, "health_timeout_s": 30.0},
    )
    gateway = await aiohttp_client(create_app(config, tokens=tokens))  # type: ignore[arg-type]
    (fast,) = gateway.app[BACKENDS].of(Route.BASELINE).upstreams
    seen: set[float] = set()

    def scraped_again() -> bool:
        if fast.scrape is not None:
            seen.add(fast.scrape.at)
        return len(seen) >= 5

    await wait_until(scraped_again, "five scrapes of the fast endpoint", timeout_s=5)
    assert gateway.app[BACKENDS].of(Route.SPECULATIVE).upstreams[0].scrape is None
