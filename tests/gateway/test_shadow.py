"""Shadow copies over fake upstreams: what a copy sends, where its answer goes (nowhere),
when it gives way (a user request, a backend leaving rotation), and its config.

Timing comparisons (live speedup against the truth, users' latency with shadows on
and off) are in benchmarks/shadow.py; these tests count events, so they do not flake.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestClient

from classifier.cost import prior_profile
from classifier.router import ProfiledPolicy
from classifier.tokens import TokenCounter
from classifier.types import Route, two_routes
from gateway.app import create_app
from gateway.backends.live import pair_state
from gateway.config import ConfigError, ShadowConfig, parse_config
from gateway.shadow.results import shadow_log_path
from gateway.state import BACKENDS, METRICS, RUNTIME, SHADOWS
from tests.gateway.conftest import GatewayFactory, ServerFactory, make_config
from tests.gateway.fake_upstream import FakeUpstream, backend_app
from tests.support import wait_until

# serial: copies go out in idle time and give way within real-time windows
pytestmark = pytest.mark.serial

Client = TestClient[web.Request, web.Application]
SHARE_ALL = {"share": 1.0}
STRUCTURED = {  # the rules policy sends it to the speculative server (structured-low-temp)
    "model": "fake-model",
    "messages": [{"role": "user", "content": "Return the user as JSON."}],
    "response_format": {"type": "json_object"},
    "temperature": 0.0,
    "top_p": 0.9,
    "seed": 7,
    "max_tokens": 50,
}


def shadows(client: Client, outcome: str, workload: str = "structured") -> float:
    value = client.app[METRICS].registry.get_sample_value(
        "specroute_shadow_requests_total", {"workload": workload, "outcome": outcome}
    )
    return value or 0.0


def user_requests(client: Client) -> float:
    registry = client.app[METRICS].registry
    return sum(
        s.value
        for family in registry.collect()
        if family.name == "specroute_requests"
        for s in family.samples
        if s.name == "specroute_requests_total"
    )


async def test_a_copy_goes_to_the_other_route_with_the_same_request_and_length(
    gateway_for: GatewayFactory, spec_upstream: FakeUpstream, base_upstream: FakeUpstream
) -> None:
    gateway = await gateway_for(shadow=SHARE_ALL)
    resp = await gateway.post("/v1/chat/completions", json=STRUCTURED)
    assert resp.status == 200 and resp.headers["x-specroute-route"] == "speculative"
    await resp.read()
    await wait_until(lambda: shadows(gateway, "completed") == 1, "the shadow to complete")
    (sent,) = base_upstream.received
    # Same messages, sampling and seed; the answer length forced to the user's 6 tokens.
    assert {k: v for k, v in sent.items() if k not in ("max_tokens", "min_tokens")} == {
        **{k: v for k, v in STRUCTURED.items() if k != "max_tokens"},
        "ignore_eos": True,
    }
    assert sent["max_tokens"] == sent["min_tokens"] == 6
    assert len(spec_upstream.received) == 1  # the user's, once
    assert user_requests(gateway) == 1  # the shadow is not a user request
    registry = gateway.app[METRICS].registry
    pair = {"workload": "structured"}
    speedup = registry.get_sample_value("specroute_shadow_speedup", pair)
    assert speedup is not None and speedup > 0  # comparable: the user request ran alone
    assert registry.get_sample_value("specroute_shadow_inflight") == 0


async def test_stats_shows_the_live_speedup_and_regret_of_the_pairs(
    gateway_for: GatewayFactory,
) -> None:
    gateway = await gateway_for(shadow=SHARE_ALL)
    before = await (await gateway.get("/stats")).json()
    assert before["speedup"] == {"value": None, "pairs": 0, "why": before["speedup"]["why"]}
    assert "shadow" in before["speedup"]["why"]
    await (await gateway.post("/v1/chat/completions", json=STRUCTURED)).read()
    await wait_until(lambda: shadows(gateway, "completed") == 1, "the shadow to complete")
    stats = await (await gateway.get("/stats")).json()
    structured = stats["workloads"]["structured"]
    registry = gateway.app[METRICS].registry
    live = registry.get_sample_value("specroute_shadow_speedup", {"workload": "structured"})
    assert live is not None
    assert structured["shadow_pairs"] == 1
    assert structured["speedup"] == pytest.approx(live, abs=1e-4)
    assert structured["regret"] >= 1.0
    assert stats["speedup"]["value"] == structured["speedup"] and stats["speedup"]["pairs"] == 1
    assert "1 shadow pairs" in stats["speedup"]["why"]
    assert stats["workloads"]["creative"]["speedup"] is None
    assert stats["workloads"]["creative"]["shadow_pairs"] == 0


async def test_a_streamed_request_is_copied_as_a_stream_with_usage(
    gateway_for: GatewayFactory, base_upstream: FakeUpstream
) -> None:
    gateway = await gateway_for(shadow=SHARE_ALL)
    resp = await gateway.post("/v1/chat/completions", json={**STRUCTURED, "stream": True})
    await resp.read()
    await wait_until(lambda: shadows(gateway, "completed") == 1, "the shadow to complete")
    (sent,) = base_upstream.received
    assert sent["stream"] is True and sent["stream_options"]["include_usage"] is True


async def test_nothing_is_copied_when_off_forced_or_failed(
    gateway_for: GatewayFactory, base_upstream: FakeUpstream, spec_upstream: FakeUpstream
) -> None:
    off = await gateway_for(shadow={"enabled": False, "share": 1.0})
    await (await off.post("/v1/chat/completions", json=STRUCTURED)).read()
    on = await gateway_for(shadow=SHARE_ALL)
    forced = {"x-specroute-route": "speculative"}  # the side-by-side page's requests
    await (await on.post("/v1/chat/completions", json=STRUCTURED, headers=forced)).read()
    spec_upstream.fail_status = 500
    await (await on.post("/v1/chat/completions", json=STRUCTURED)).read()
    await wait_until(lambda: base_upstream.received, "the failed request's failover")
    assert len(base_upstream.received) == 1  # the failover, not a shadow
    assert shadows(off, "completed") == shadows(on, "completed") == 0
    assert shadows(on, "skipped") == 0


def _echo_backend(route: str) -> tuple[web.Application, list[dict[str, Any]]]:
    """A backend whose answer names itself and repeats the prompt's marker."""
    received: list[dict[str, Any]] = []

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        received.append(body)
        marker = body["messages"][-1]["content"]
        text = f"{route}-answer:{marker}"
        usage = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
        message = {"role": "assistant", "content": text}
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": "length"}
            return web.json_response({"id": "x", "choices": [choice], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"id": "x", "choices": [{"index": 0, "delta": message, "finish_reason": None}]}
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            last = {"id": "x", "choices": [], "usage": usage}
            await response.write(b"data: " + json.dumps(last).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    return backend_app(generate), received


@pytest.mark.parametrize("stream", [False, True])
async def test_a_shadow_answer_reaches_no_client_and_no_log(
    aiohttp_server: ServerFactory,
    aiohttp_client: Any,
    tokens: TokenCounter,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    stream: bool,
) -> None:
    spec_app, _ = _echo_backend("speculative")
    base_app, base_received = _echo_backend("baseline")
    spec, base = await aiohttp_server(spec_app), await aiohttp_server(base_app)
    outcomes, recorded = tmp_path / "outcomes.jsonl", tmp_path / "recorded.jsonl"
    config = make_config(
        str(spec.make_url("")),
        str(base.make_url("")),
        shadow=SHARE_ALL,
        outcome_log={"path": str(outcomes)},
        record={"path": str(recorded)},
    )
    marker = f"marker-{uuid.uuid4().hex}"
    body = {**STRUCTURED, "messages": [{"role": "user", "content": marker}], "stream": stream}
    with structlog.testing.capture_logs() as logs:
        gateway = await aiohttp_client(create_app(config, tokens=tokens))
        resp = await gateway.post("/v1/chat/completions", json=body)
        answer = await resp.text()
        await wait_until(lambda: shadows(gateway, "completed") == 1, "the shadow to complete")
        assert base_received and base_received[0]["messages"][0]["content"] == marker
        scraped = await (await gateway.get("/metrics")).text()
        await gateway.close()  # flushes the outcome log and the recorder
    assert f"speculative-answer:{marker}" in answer
    assert "baseline-answer" not in answer
    (user_line,) = outcomes.read_text().splitlines()  # one per user request, as always
    assert json.loads(user_line)["route"] == "speculative"
    (line,) = shadow_log_path(outcomes).read_text().splitlines()
    shadow_line = json.loads(line)
    assert shadow_line["kind"] == "shadow" and shadow_line["outcome"] == "completed"
    assert shadow_line["shadow_route"] == "baseline" and "route" not in shadow_line
    places = {
        "outcome log": outcomes.read_text(),
        "shadow log": shadow_log_path(outcomes).read_text(),
        "recording": recorded.read_text(),  # redacted: not even the user's prompt
        "structlog": json.dumps(logs, default=str),
        "stdout and stderr": "".join(capsys.readouterr()),
        "metrics": scraped,
    }
    for where, text in places.items():
        assert "baseline-answer" not in text, where
        assert marker not in text, where


async def test_a_user_request_cancels_a_running_shadow(
    gateway_for: GatewayFactory, base_upstream: FakeUpstream
) -> None:
    base_upstream.chunk_delay_s = 1.0  # a whole answer of 6 words takes 6 s there
    gateway = await gateway_for(shadow=SHARE_ALL)
    await (await gateway.post("/v1/chat/completions", json=STRUCTURED)).read()
    await wait_until(base_upstream.arrived.is_set, "the shadow to reach the baseline")
    await (await gateway.post("/v1/chat/completions", json=STRUCTURED)).read()
    # Sent to the speculative server, on the GPU the shadow shares: the shadow gave way.
    await wait_until(base_upstream.cancelled.is_set, "the baseline to see the shadow go")
    assert shadows(gateway, "cancelled") >= 1
    assert shadows(gateway, "completed") == 0
    assert user_requests(gateway) == 2


async def test_no_shadow_runs_while_a_backend_is_unhealthy_and_a_running_one_stops(
    gateway_for: GatewayFactory, base_upstream: FakeUpstream, spec_upstream: FakeUpstream
) -> None:
    base_upstream.chunk_delay_s = 1.0
    gateway = await gateway_for(shadow=SHARE_ALL)
    await (await gateway.post("/v1/chat/completions", json=STRUCTURED)).read()
    await wait_until(base_upstream.arrived.is_set, "the shadow to reach the baseline")
    base_upstream.healthy = False  # the prober takes it out of rotation
    await wait_until(base_upstream.cancelled.is_set, "the shadow to stop")
    assert shadows(gateway, "cancelled") == 1
    baseline = gateway.app[BACKENDS].pairs[0].of(Route.BASELINE)[0]
    await wait_until(lambda: not baseline.healthy, "the baseline to leave rotation")
    for _ in range(3):
        await (await gateway.post("/v1/chat/completions", json=STRUCTURED)).read()
    await wait_until(lambda: shadows(gateway, "skipped") == 3, "three copies skipped")
    assert len(base_upstream.received) == 1  # only the first shadow ever went there
    assert shadows(gateway, "completed") == 0


async def test_a_scraped_shadow_is_not_another_client(
    gateway_for: GatewayFactory, base_upstream: FakeUpstream, spec_upstream: FakeUpstream
) -> None:
    """vLLM counts a shadow running; the router must not take it for other clients."""
    base_upstream.chunk_delay_s = 1.0
    base_upstream.metrics_text = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
    gateway = await gateway_for(shadow=SHARE_ALL, upstream={"scrape_interval_s": 0.05})
    await (await gateway.post("/v1/chat/completions", json=STRUCTURED)).read()
    await wait_until(base_upstream.arrived.is_set, "the shadow to reach the baseline")
    base_upstream.metrics_text = base_upstream.metrics_text.replace("running 0", "running 1")
    pool = gateway.app[BACKENDS]
    await wait_until(
        lambda: pool.live_state(0).of(Route.BASELINE).others == 1, "a scrape that saw it"
    )
    corrected = pair_state(pool, 0, gateway.app[SHADOWS])
    assert corrected.of(Route.BASELINE).others == 0 and corrected.of(Route.BASELINE).running == 0


async def test_another_clients_requests_in_a_scrape_cancel_a_running_shadow(
    gateway_for: GatewayFactory, base_upstream: FakeUpstream, spec_upstream: FakeUpstream
) -> None:
    """Another replica's or a direct client's batch on the GPU: the shadow gives way,
    though no request through this gateway arrived (user_arrived never fires)."""
    base_upstream.chunk_delay_s = 1.0
    idle = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
    base_upstream.metrics_text = spec_upstream.metrics_text = idle
    gateway = await gateway_for(shadow=SHARE_ALL, upstream={"scrape_interval_s": 0.05})
    await (await gateway.post("/v1/chat/completions", json=STRUCTURED)).read()
    await wait_until(base_upstream.arrived.is_set, "the shadow to reach the baseline")
    await wait_until(lambda: shadows(gateway, "cancelled") == 0, "it runs")
    assert not base_upstream.cancelled.is_set()
    # The speculative server, the shadow's neighbour on the GPU, now runs 3 of another's.
    spec_upstream.metrics_text = idle.replace("running 0", "running 3")
    await wait_until(base_upstream.cancelled.is_set, "the shadow to give way")
    assert shadows(gateway, "cancelled") == 1
    assert shadows(gateway, "completed") == 0
    assert user_requests(gateway) == 1


def test_the_shadow_table_is_checked() -> None:
    backends = {"speculative": {"urls": ["http://a:1"]}, "baseline": {"urls": ["http://b:2"]}}
    assert parse_config({"backends": backends}).shadow == ShadowConfig(True, 0.05, 1)
    for bad, message in (
        ({"share": 1.5}, "shadow.share must be within [0, 1]"),
        ({"max_inflight": 0}, "shadow.max_inflight must be >= 1"),
        ({"sahre": 0.1}, "unknown key 'shadow.sahre'"),
        ({"enabled": "yes"}, "shadow.enabled must be true or false"),
    ):
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            parse_config({"backends": backends, "shadow": bad})


async def test_with_a_gpu_each_only_a_request_to_the_shadows_server_cancels_it(
    gateway_for: GatewayFactory, base_upstream: FakeUpstream
) -> None:
    base_upstream.chunk_delay_s = 1.0
    gateway = await gateway_for(shadow=SHARE_ALL, routing={"policy": "profiled"})
    policy = gateway.app[RUNTIME].current.policy
    assert isinstance(policy, ProfiledPolicy)
    apart = dataclasses.replace(prior_profile(two_routes(4, 0.1)).with_beside(1.0), source="test")
    policy.use_profile(apart)  # as profiled: a GPU each
    assert policy.shared_gpu() is False
    await (await gateway.post("/v1/chat/completions", json=STRUCTURED)).read()
    await wait_until(base_upstream.arrived.is_set, "the shadow to reach the baseline")
    to_spec = {"x-specroute-route": "speculative"}
    await (await gateway.post("/v1/chat/completions", json=STRUCTURED, headers=to_spec)).read()
    assert not base_upstream.cancelled.is_set()  # the other GPU: the shadow runs on
    assert gateway.app[METRICS].registry.get_sample_value("specroute_shadow_inflight") == 1
    to_base = {"x-specroute-route": "baseline"}
    streamed = {**STRUCTURED, "stream": True}  # its headers come at once
    resp = await gateway.post("/v1/chat/completions", json=streamed, headers=to_base)
    await wait_until(base_upstream.cancelled.is_set, "the shadow to give way")
    assert shadows(gateway, "cancelled") == 1
    resp.close()


async def test_a_drain_stops_the_shadows(
    gateway_for: GatewayFactory, base_upstream: FakeUpstream
) -> None:
    base_upstream.chunk_delay_s = 1.0
    gateway = await gateway_for(shadow=SHARE_ALL)
    await (await gateway.post("/v1/chat/completions", json=STRUCTURED)).read()
    await wait_until(base_upstream.arrived.is_set, "the shadow to reach the baseline")
    gateway.app[RUNTIME].draining = True
    await wait_until(base_upstream.cancelled.is_set, "the shadow to stop")
    assert shadows(gateway, "cancelled") == 1
