"""Per-request acceptance: vLLM's own report first, streamed steps as the fallback."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from gateway.wire.acceptance import (
    PER_REQUEST_METRICS,
    STREAM_STEPS,
    from_report,
    from_stream_steps,
)
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_observability import samples
from tests.gateway.test_routing import chat

Client = TestClient[web.Request, web.Application]
SPEC = {"x-specroute-route": "speculative"}

# The shape vLLM 0.32 returns with --per-request-spec-decode-metrics summary
# (vllm/entrypoints/generate/base/protocol.py: SpeculativeDecodingMetrics).
VLLM_REPORT = {
    "metrics": {
        "speculative_decoding": {
            "mean_acceptance_length": 2.5,
            "draft_acceptance_rate": 0.375,
            "acceptance_histogram": [1, 0, 1, 0, 0],
            "num_spec_steps": 2,
            "num_accepted_draft_tokens": 3,
            "num_draft_tokens": 8,
            "num_spec_tokens": 4,
        }
    }
}


def test_from_report_reads_vllm_metrics() -> None:
    measured = from_report(VLLM_REPORT)
    assert measured is not None
    assert (measured.rate, measured.mean_length, measured.source) == (
        0.375,
        2.5,
        PER_REQUEST_METRICS,
    )
    assert measured.per_step == 0.375  # (2.5 - 1) / k: every step drafted, as far as it says
    assert from_report({"usage": {}}) is None
    assert from_report(None) is None


def test_from_report_counts_the_steps_that_drafted_nothing() -> None:
    """The real pair's chat answer at temperature 0 (2026-12-03): 64 tokens, 2 of its 61
    steps drafted, 3 of 8 drafts accepted. vLLM's rate 0.375 and length 2.5 are the two
    drafting steps'; the answer gained 63 / 60 = 1.05 tokens a step."""
    measured = from_report(VLLM_REPORT, completion_tokens=64)
    assert measured is not None
    assert measured.rate == 0.375
    assert measured.mean_length == pytest.approx(63 / 60)
    assert measured.per_step == pytest.approx((63 / 60 - 1) / 4)
    nothing_drafted = json.loads(json.dumps(VLLM_REPORT))
    spec = nothing_drafted["metrics"]["speculative_decoding"]
    spec.update(num_draft_tokens=0, num_spec_steps=0, num_accepted_draft_tokens=0)
    none = from_report(nothing_drafted, completion_tokens=64)
    assert none is not None  # a measurement: this answer gained nothing
    assert (none.rate, none.mean_length, none.per_step) == (0.0, 1.0, 0.0)
    # A length that cannot be (fewer steps than vLLM counted drafting): vLLM's own figure.
    short = from_report(VLLM_REPORT, completion_tokens=4)
    assert short is not None and short.mean_length == 2.5


def test_from_stream_steps() -> None:
    # 12 tokens in 4 steps: 3 tokens a step, 2 of k=4 drafts accepted each step.
    measured = from_stream_steps(12, 4, 4)
    assert measured is not None
    assert (measured.rate, measured.mean_length, measured.source) == (0.5, 3.0, STREAM_STEPS)
    assert from_stream_steps(None, 4, 4) is None
    assert from_stream_steps(5, 0, 4) is None


async def test_stream_steps_fallback_counts_token_events(
    gateway: Client, spec_upstream: FakeUpstream
) -> None:
    """The fake sends one event per token (nothing accepted): acceptance 0, length 1."""
    with capture_logs() as logs:
        resp = await gateway.post(
            "/v1/chat/completions", json=chat("hi", stream=True), headers=SPEC
        )
        await resp.read()
    line = next(e for e in logs if e["event"] == "request")
    assert line["acceptance_source"] == STREAM_STEPS
    assert line["acceptance"] == 0.0 and line["acceptance_length"] == 1.0
    m = samples(await (await gateway.get("/metrics")).text())
    key = (
        "specroute_spec_acceptance_ratio_count",
        (("route", "speculative"), ("source", STREAM_STEPS), ("workload", "chat")),
    )
    assert m[key] == 1


async def test_multi_token_steps_raise_the_measured_acceptance(
    gateway: Client, spec_upstream: FakeUpstream
) -> None:
    """6 events standing for 3 tokens each: 3 tokens a step, 2 of k=4 drafts accepted."""
    spec_upstream.tokens_per_event = 3
    with capture_logs() as logs:
        resp = await gateway.post(
            "/v1/chat/completions", json=chat("hi", stream=True), headers=SPEC
        )
        await resp.read()
    line = next(e for e in logs if e["event"] == "request")
    assert line["completion_tokens"] == 18
    assert line["acceptance_length"] == 3.0 and line["acceptance"] == 0.5


async def test_baseline_route_measures_no_acceptance(gateway: Client) -> None:
    with capture_logs() as logs:
        resp = await gateway.post(
            "/v1/chat/completions",
            json=chat("hi", stream=True),
            headers={"x-specroute-route": "baseline"},
        )
        await resp.read()
    line = next(e for e in logs if e["event"] == "request")
    assert line["acceptance"] is None and line["acceptance_source"] is None
