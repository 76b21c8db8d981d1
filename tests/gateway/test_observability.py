"""Metrics with their labels, the one log line per request, health and readiness."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from classifier.tokens import TokenCounter
from gateway.app import create_app
from tests.gateway.conftest import ClientFactory, make_config
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_routing import SCHEMA, chat
from tests.support import wait_until

Client = TestClient[web.Request, web.Application]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_carry_route_workload_reason_and_status(gateway: Client) -> None:
    structured = chat(
        "Extract: Ada, 36",
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
        stream=True,
    )
    await (await gateway.post("/v1/chat/completions", json=structured)).read()
    await (await gateway.post("/v1/chat/completions", json=chat("A poem", temperature=1.5))).read()
    await (await gateway.post("/v1/chat/completions", data=b"{bad")).read()

    resp = await gateway.get("/metrics")
    assert resp.status == 200
    m = samples(await resp.text())
    key = "specroute_requests_total"
    assert m[(key, (("route", "speculative"), ("status", "2xx"), ("workload", "structured")))] == 1
    assert m[(key, (("route", "baseline"), ("status", "2xx"), ("workload", "creative")))] == 1
    assert m[(key, (("route", "_none"), ("status", "4xx"), ("workload", "none")))] == 1
    decisions = "specroute_route_decisions_total"
    assert m[(decisions, (("reason", "structured-low-temp"), ("route", "speculative")))] == 1
    assert m[(decisions, (("reason", "high-temperature"), ("route", "baseline")))] == 1
    spec = (("route", "speculative"), ("workload", "structured"))
    assert m[("specroute_request_duration_seconds_count", spec)] == 1
    assert m[("specroute_time_to_first_token_seconds_count", spec)] == 1
    assert m[("specroute_time_per_output_token_seconds_count", spec)] == 1
    assert m[("specroute_output_tokens_total", spec)] == 6
    # the non-streamed request has no TTFT
    base = (("route", "baseline"), ("workload", "creative"))
    assert ("specroute_time_to_first_token_seconds_count", base) not in m
    assert m[("specroute_inflight_requests", (("route", "speculative"),))] == 0


async def test_one_log_line_per_request_without_prompt_text(gateway: Client) -> None:
    secret = "my-very-private-prompt-text"
    with capture_logs() as logs:
        resp = await gateway.post(
            "/v1/chat/completions",
            json=chat(secret, temperature=0, stream=True),
            headers={"X-Request-Id": "req-123"},
        )
        await resp.read()
    assert resp.headers["X-Request-Id"] == "req-123"
    lines = [entry for entry in logs if entry["event"] == "request"]
    assert len(lines) == 1
    line = lines[0]
    assert line["route"] == resp.headers["x-specroute-route"]
    assert line["reason"] == resp.headers["x-specroute-reason"]
    assert line["status"] == "2xx"
    assert line["completion_tokens"] == 6 and line["prompt_tokens"] == 7
    assert line["ttft_s"] is not None and line["duration_s"] >= line["ttft_s"]
    assert secret not in repr(logs)


async def test_request_ids_are_generated_and_junk_ids_replaced(gateway: Client) -> None:
    resp = await gateway.post(
        "/v1/chat/completions", json=chat("hi"), headers={"X-Request-Id": "bad id; drop"}
    )
    assert resp.headers["X-Request-Id"] != "bad id; drop"
    assert len(resp.headers["X-Request-Id"]) == 32


async def test_health_ready_and_models(gateway: Client) -> None:
    assert (await (await gateway.get("/health")).json()) == {"status": "ok"}
    ready = await gateway.get("/ready")
    assert ready.status == 200
    assert (await ready.json())["backends"] == {"speculative": True, "baseline": True}
    models = await (await gateway.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["fake-model"]  # deduplicated


async def test_ready_follows_backend_health(
    gateway: Client, spec_upstream: FakeUpstream, base_upstream: FakeUpstream
) -> None:
    """/ready reads the prober's results (every 0.2 s here), never probes per call."""

    async def ready_is(status: int, backends: dict[str, bool] | None = None) -> Any:
        resp = await gateway.get("/ready")
        body = await resp.json()
        if resp.status != status or (backends is not None and body["backends"] != backends):
            return None
        return body

    spec_upstream.healthy = False
    spec_down = {"speculative": False, "baseline": True}
    await wait_until(lambda: ready_is(200, spec_down), "/ready sees the speculative server down")
    base_upstream.healthy = False
    body = await wait_until(lambda: ready_is(503), "/ready 503 with both down")
    assert body["error"]["code"] == "not_ready"
    m = samples(await (await gateway.get("/metrics")).text())
    assert m[("specroute_backend_up", (("route", "baseline"),))] == 0


async def test_models_is_the_union_of_both_backends(
    aiohttp_client: ClientFactory,
    aiohttp_server: object,
    spec_server: TestServer,
    base_upstream: FakeUpstream,
    base_server: TestServer,
    tokens: TokenCounter,
) -> None:
    base_upstream.model = "other-model"
    config = make_config(str(spec_server.make_url("")), str(base_server.make_url("")))
    client = await aiohttp_client(create_app(config, tokens=tokens))
    models = await (await client.get("/v1/models")).json()
    assert sorted(m["id"] for m in models["data"]) == ["fake-model", "other-model"]


async def test_models_with_no_backend_is_502(
    aiohttp_client: ClientFactory, unused_tcp_port_factory: object, tokens: TokenCounter
) -> None:
    ports = [unused_tcp_port_factory() for _ in range(2)]  # type: ignore[operator]
    config = make_config(*(f"http://127.0.0.1:{p}" for p in ports))
    client = await aiohttp_client(create_app(config, tokens=tokens))
    resp = await client.get("/v1/models")
    assert resp.status == 502
    assert (await client.get("/ready")).status == 503


def test_web_app_is_built_once_per_config(config: object, tokens: TokenCounter) -> None:
    app = create_app(config, tokens=tokens)  # type: ignore[arg-type]
    other = create_app(config, tokens=tokens)  # type: ignore[arg-type]
    assert isinstance(app, web.Application)
    from gateway.state import METRICS

    assert app[METRICS].registry is not other[METRICS].registry
