"""Backends that break HTTP and SSE, driven through the gateway: what the client gets,
whether the other backend answers, and what the counters say, for each way of breaking.

The rule under test: every backend failure, whatever its form (no answer, an answer
no parser takes, a stream cut, stalled, dripped, unended or unframed), is the
backend's failure. Before any byte reached the client it is failed over like a
refused connection or a 5xx; after, the stream ends with an error event and
[DONE]. Either way it is counted in specroute_upstream_errors_total with its kind,
and counts towards ejecting that backend.

A hostile /metrics (figures NaN, infinite, negative or out of range, a line that does
not parse, a body without end) or /v1/models (JSON too deep to parse) never takes
routing down: the bad figure is unknown and counted in specroute_scrape_errors_total,
the scrape loop goes on, and the other backend's models answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from classifier.tokens import TokenCounter
from classifier.types import Route
from gateway.app import create_app
from gateway.backends.scraper import MAX_BODY_BYTES
from gateway.state import BACKENDS
from tests.gateway.conftest import ClientFactory, RawUpstreams, make_config
from tests.gateway.misbehaving_upstream import (
    DEEP_MODELS,
    MALFORMED,
    Behaviour,
    MisbehavingUpstream,
    events,
)
from tests.gateway.test_observability import samples
from tests.gateway.test_routing import chat
from tests.support import wait_until

pytestmark = pytest.mark.serial  # a failure must show within PROMPT_S of wall-clock time

Client = TestClient[web.Request, web.Application]
SPEC = {"x-specroute-route": "speculative"}
READ_TIMEOUT_S = 0.3
# A failure must show within a few read timeouts (a drip of one byte every 20 ms
# never trips the read timeout between bytes).
PROMPT_S = 2.0


@pytest.fixture
async def gateway(
    aiohttp_client: ClientFactory, raw_upstreams: RawUpstreams, tokens: TokenCounter
) -> Client:
    spec, base = raw_upstreams
    upstream: dict[str, object] = {"read_timeout_s": READ_TIMEOUT_S, "eject_after_failures": 100}
    config = make_config(spec.url, base.url, upstream=upstream)
    return await aiohttp_client(create_app(config, tokens=tokens))


async def counters(gateway: Client) -> dict[str, Any]:
    """upstream_errors_total by (route, kind) and requests_total by (route, status)."""
    m = samples(await (await gateway.get("/metrics")).text())
    errors = {
        (dict(k)["route"], dict(k)["kind"]): v
        for (name, k), v in m.items()
        if name == "specroute_upstream_errors_total" and v
    }
    requests = {
        (dict(k)["route"], dict(k)["status"]): v
        for (name, k), v in m.items()
        if name == "specroute_requests_total" and v
    }
    return {"errors": errors, "requests": requests}


def sse(body: bytes) -> list[bytes]:
    return [e for e in body.split(b"\n\n") if e]


def error_code(event: bytes) -> str:
    return str(json.loads(event.removeprefix(b"data: "))["error"]["code"])


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("behaviour", MALFORMED, ids=lambda b: b.value)
async def test_an_answer_no_parser_takes_fails_over(
    gateway: Client, raw_upstreams: RawUpstreams, behaviour: Behaviour, stream: bool
) -> None:
    spec, _ = raw_upstreams
    spec.behaviour = behaviour
    resp = await gateway.post("/v1/chat/completions", json=chat("hi", stream=stream), headers=SPEC)
    assert resp.status == 200
    assert resp.headers["x-specroute-route"] == "baseline"
    assert resp.headers["x-specroute-failover"] == "speculative"
    await resp.read()
    seen = await counters(gateway)
    assert seen["errors"] == {("speculative", "upstream_malformed"): 1}
    assert seen["requests"] == {("baseline", "2xx"): 1}


@pytest.mark.parametrize("behaviour", MALFORMED, ids=lambda b: b.value)
async def test_an_answer_no_parser_takes_from_both_backends_is_a_502(
    gateway: Client, raw_upstreams: RawUpstreams, behaviour: Behaviour
) -> None:
    """Before: a 500 "internal gateway error" with a traceback, counted nowhere."""
    for upstream in raw_upstreams:
        upstream.behaviour = behaviour
    resp = await gateway.post("/v1/chat/completions", json=chat("hi"), headers=SPEC)
    assert resp.status == 502
    error = (await resp.json())["error"]
    assert error["code"] == "upstream_malformed" and error["type"] == "upstream_error"
    assert "baseline" in error["message"]  # the last one tried
    seen = await counters(gateway)
    assert seen["errors"] == {
        ("speculative", "upstream_malformed"): 1,
        ("baseline", "upstream_malformed"): 1,
    }
    assert seen["requests"] == {("baseline", "5xx"): 1}


@pytest.mark.parametrize("behaviour", MALFORMED, ids=lambda b: b.value)
async def test_a_passed_through_answer_no_parser_takes(
    gateway: Client, raw_upstreams: RawUpstreams, behaviour: Behaviour
) -> None:
    """A read goes to the other backend; from both, a 502 in OpenAI's shape."""
    spec, base = raw_upstreams
    spec.behaviour = behaviour
    resp = await gateway.get("/version", headers=SPEC)
    assert resp.status == 200 and (await resp.json())["id"] == "baseline-1"
    base.behaviour = behaviour
    resp = await gateway.get("/version", headers=SPEC)
    assert resp.status == 502
    assert (await resp.json())["error"]["code"] == "upstream_malformed"
    seen = await counters(gateway)
    assert seen["errors"] == {
        ("speculative", "upstream_malformed"): 2,
        ("baseline", "upstream_malformed"): 1,
    }


async def test_a_passed_through_answer_cut_short_is_cut_short_for_the_client(
    gateway: Client, raw_upstreams: RawUpstreams
) -> None:
    """Its status went out: the client's connection closes mid-body (a clean end would
    lie), and the backend's failure is counted."""
    spec, _ = raw_upstreams
    spec.behaviour = Behaviour.RESET_MID_BODY
    resp = await gateway.get("/version", headers=SPEC)
    assert resp.status == 200
    with pytest.raises(aiohttp.ClientPayloadError):
        await resp.read()
    assert (await counters(gateway))["errors"] == {("speculative", "upstream_broken"): 1}


STREAM_FAILURES = [
    (Behaviour.HEADERS_THEN_SILENCE, "upstream_stall", 0),
    (Behaviour.DRIP, "upstream_stall", 0),
    (Behaviour.NO_BLANK_LINES, "upstream_malformed", 0),
    (Behaviour.NO_DONE, "upstream_truncated", len(events("x")) - 2),  # less usage, [DONE]
    (Behaviour.RESET_MID_BODY, "upstream_broken", 1),
]


@pytest.mark.parametrize(
    ("behaviour", "kind", "relayed"), STREAM_FAILURES, ids=[f[0].value for f in STREAM_FAILURES]
)
async def test_a_stream_that_breaks_after_its_headers_ends_with_an_error_event(
    gateway: Client, raw_upstreams: RawUpstreams, behaviour: Behaviour, kind: str, relayed: int
) -> None:
    """The status went out with the headers: the events that came are relayed, then the
    error event and [DONE]; never a stream that looks complete, never a wait without end."""
    spec, base = raw_upstreams
    spec.behaviour = behaviour
    started = time.monotonic()
    async with asyncio.timeout(10):
        resp = await gateway.post(
            "/v1/chat/completions", json=chat("hi", stream=True), headers=SPEC
        )
        got = sse(await resp.read())
    assert time.monotonic() - started < PROMPT_S
    assert resp.status == 200
    assert got[:relayed] == [e.rstrip(b"\n") for e in events("speculative")[:relayed]]
    assert len(got) == relayed + 2
    assert error_code(got[-2]) == kind
    assert got[-1] == b"data: [DONE]"
    assert not base.received  # bytes were sent: no retry
    seen = await counters(gateway)
    assert seen["errors"] == {("speculative", kind): 1}
    assert seen["requests"] == {("speculative", "stream_error"): 1}


async def test_a_stream_framed_with_crlf_is_relayed_as_events(
    gateway: Client, raw_upstreams: RawUpstreams
) -> None:
    """SSE allows CRLF line ends: the client gets the same events, LF-framed, and the
    usage chunk the gateway asked for is removed as from any stream."""
    spec, _ = raw_upstreams
    spec.behaviour = Behaviour.CRLF_SSE
    resp = await gateway.post("/v1/chat/completions", json=chat("hi", stream=True), headers=SPEC)
    got = sse(await resp.read())
    sent = [e.rstrip(b"\n") for e in events("speculative")]
    assert got == [e for e in sent if b'"usage"' not in e]
    seen = await counters(gateway)
    assert seen["errors"] == {}
    assert seen["requests"] == {("speculative", "2xx"): 1}


WHOLE_FAILURES = [
    (Behaviour.SILENCE, 504, "upstream_stall", "speculative"),
    (Behaviour.HEADERS_THEN_SILENCE, 504, "upstream_stall", "speculative"),
    (Behaviour.DRIP, 504, "upstream_stall", "speculative"),
    # Nothing reached the client yet: the other backend answers.
    (Behaviour.RESET_MID_BODY, 200, "upstream_broken", "baseline"),
]


@pytest.mark.parametrize(
    ("behaviour", "status", "kind", "answered_by"),
    WHOLE_FAILURES,
    ids=[f[0].value for f in WHOLE_FAILURES],
)
async def test_a_whole_answer_that_breaks(
    gateway: Client,
    raw_upstreams: RawUpstreams,
    behaviour: Behaviour,
    status: int,
    kind: str,
    answered_by: str,
) -> None:
    """A stall is not retried (the backend may still be generating: a retry would double
    the load); a broken answer is, like a 5xx. A drip is a stall: the answer must
    come whole within the read timeout once its headers are in."""
    spec, base = raw_upstreams
    spec.behaviour = behaviour
    started = time.monotonic()
    async with asyncio.timeout(10):
        resp = await gateway.post("/v1/chat/completions", json=chat("hi"), headers=SPEC)
        answer = await resp.json()
    assert time.monotonic() - started < PROMPT_S
    assert resp.status == status
    assert resp.headers["x-specroute-route"] == answered_by
    if status != 200:
        assert answer["error"]["code"] == kind
    seen = await counters(gateway)
    assert seen["errors"] == {("speculative", kind): 1}
    assert len(base.received) == (answered_by == "baseline")


async def test_a_wedged_backend_is_ejected_though_it_answers_health(
    aiohttp_client: ClientFactory, raw_upstreams: RawUpstreams, tokens: TokenCounter
) -> None:
    """Its /health says 200 between the requests it stalls: before, each probe wiped the
    failures, and every request sent there waited out the read timeout, for ever."""
    spec, base = raw_upstreams
    spec.behaviour = Behaviour.SILENCE
    upstream: dict[str, object] = {
        "read_timeout_s": READ_TIMEOUT_S,
        "health_interval_s": 0.05,
        "eject_after_failures": 3,
        "eject_s": 60.0,
    }
    gateway = await aiohttp_client(
        create_app(make_config(spec.url, base.url, upstream=upstream), tokens=tokens)
    )
    statuses = []
    for _ in range(6):
        resp = await gateway.post("/v1/chat/completions", json=chat("hi"), headers=SPEC)
        statuses.append((resp.status, resp.headers["x-specroute-route"]))
        await asyncio.sleep(0.1)  # a probe round or two in between
    assert statuses == [(504, "speculative")] * 3 + [(200, "baseline")] * 3
    assert len(spec.received) == 3
    # Its ejection over (ended here, not waited for), a probe readmits it on probation:
    # its next failure ejects it again at once, not after three more.
    pool = gateway.app[BACKENDS]
    (wedged,) = pool.of(Route.SPECULATIVE).upstreams
    wedged.ejected_until = 0.0
    await wait_until(lambda: wedged.healthy, "speculative readmitted")
    resp = await gateway.post("/v1/chat/completions", json=chat("hi"), headers=SPEC)
    assert (resp.status, resp.headers["x-specroute-route"]) == (504, "speculative")
    assert not wedged.healthy


async def scraping_gateway(
    aiohttp_client: ClientFactory,
    raw_upstreams: RawUpstreams,
    tokens: TokenCounter,
    **upstream: object,
) -> Client:
    """A gateway that scrapes every 50 ms unless told otherwise."""
    spec, base = raw_upstreams
    settings = {"scrape_interval_s": 0.05, "eject_after_failures": 100, **upstream}
    config = make_config(spec.url, base.url, upstream=settings)
    return await aiohttp_client(create_app(config, tokens=tokens))


async def scrape_errors(gateway: Client, upstream: MisbehavingUpstream) -> dict[str, float]:
    """specroute_scrape_errors_total of one server, by kind (the nonzero ones)."""
    m = samples(await (await gateway.get("/metrics")).text())
    return {
        dict(k)["kind"]: v
        for (name, k), v in m.items()
        if name == "specroute_scrape_errors_total" and dict(k)["url"] == upstream.url and v
    }


GOOD_LINES = b'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
HOSTILE_FIGURES = {
    "nan": (b'vllm:num_requests_running{engine="0"} NaN\n', "non_finite"),
    "inf": (b'vllm:num_requests_running{engine="0"} +Inf\n', "non_finite"),
    "minus_inf": (b'vllm:num_requests_running{engine="0"} -Inf\n', "non_finite"),
    "negative": (b'vllm:num_requests_running{engine="0"} -3\n', "negative"),
    "kv_over_1": (b'vllm:kv_cache_usage_perc{engine="0"} 1.5\n', "out_of_range"),
    # Each engine's figure within bounds, their sum not.
    "sum_too_big": (b'vllm:num_requests_running{engine="0"} 6e5\n' * 2, "out_of_range"),
    "unclosed_brace": (b'vllm:num_requests_running{engine="0" 3\n', "malformed"),
}


@pytest.mark.parametrize(("line", "kind"), HOSTILE_FIGURES.values(), ids=list(HOSTILE_FIGURES))
async def test_a_hostile_figure_is_unknown_and_counted_and_routing_goes_on(
    aiohttp_client: ClientFactory,
    raw_upstreams: RawUpstreams,
    tokens: TokenCounter,
    line: bytes,
    kind: str,
) -> None:
    """Before: every routed request and /stats answered 500 (int(NaN) in the live
    state), and the one scraper task died silently. Now the figure is unknown, the
    scrape's other figures are kept, and every scrape counts its fault again."""
    spec, base = raw_upstreams
    spec.metrics = GOOD_LINES + line
    gateway = await scraping_gateway(aiohttp_client, raw_upstreams, tokens)
    first = await wait_until(lambda: scrape_errors(gateway, spec), "the fault counted")
    assert list(first) == [kind]
    # Counted again by the scrapes that follow: the loop outlived the bad one.
    await wait_until(lambda: _more(gateway, spec, first), "the scrapes that follow counted too")
    assert await scrape_errors(gateway, base) == {}
    # The last scrape itself: the live state's figures go stale 3 intervals (150 ms) on.
    scrape = gateway.app[BACKENDS].of(Route.SPECULATIVE).upstreams[0].scrape
    assert scrape is not None
    assert scrape.waiting == 2  # the good figure of the same scrape
    assert scrape.running is None and scrape.kv_usage is None
    for headers in ({}, SPEC):
        resp = await gateway.post("/v1/chat/completions", json=chat("hi"), headers=headers)
        assert resp.status == 200, await resp.text()
    assert (await gateway.get("/stats")).status == 200


async def _more(gateway: Client, upstream: MisbehavingUpstream, than: dict[str, float]) -> bool:
    now = await scrape_errors(gateway, upstream)
    return all(now.get(kind, 0) > n for kind, n in than.items())


async def test_an_endless_metrics_body_is_dropped_unread_past_its_bound(
    aiohttp_client: ClientFactory, raw_upstreams: RawUpstreams, tokens: TokenCounter
) -> None:
    """Before: the body was read whole (resp.text()), and the gateway's memory grew from
    85 MB to 1.2 GB in 12 s. Now the scrape ends as too_large once past the bound, the
    connection closed, and requests are routed meanwhile."""
    spec, base = raw_upstreams
    spec.endless_metrics = True
    base.metrics = GOOD_LINES
    # One scrape at start; a timeout far off, so only the bound can end it.
    gateway = await scraping_gateway(
        aiohttp_client, raw_upstreams, tokens, scrape_interval_s=60.0, health_timeout_s=30.0
    )
    started = time.monotonic()
    resp = await gateway.post("/v1/chat/completions", json=chat("hi"))
    assert resp.status == 200
    assert await wait_until(
        lambda: scrape_errors(gateway, spec), "the body dropped", timeout_s=10
    ) == {"too_large": 1}
    assert time.monotonic() - started < 10
    sent = spec.metrics_sent
    assert MAX_BODY_BYTES < sent < 2 * MAX_BODY_BYTES  # the rest never read...
    await asyncio.sleep(0.3)
    assert spec.metrics_sent == sent  # ...and the connection closed
    assert gateway.app[BACKENDS].live_state().of(Route.BASELINE).waiting == 2
    assert await scrape_errors(gateway, base) == {}


async def test_models_skip_a_backend_whose_answer_is_too_deep_to_parse(
    gateway: Client, raw_upstreams: RawUpstreams
) -> None:
    """Before: json.loads' RecursionError (no ValueError) was a 500, though the other
    backend answered well."""
    spec, base = raw_upstreams
    spec.models = DEEP_MODELS
    resp = await gateway.get("/v1/models")
    assert resp.status == 200
    assert [m["id"] for m in (await resp.json())["data"]] == ["fake-model"]
    base.models = DEEP_MODELS
    resp = await gateway.get("/v1/models")
    assert resp.status == 502
    assert (await resp.json())["error"]["code"] == "upstream_unavailable"
