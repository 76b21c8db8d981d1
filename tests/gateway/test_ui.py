"""/ui, the dry-run decision (/decide/...) and the live figures (/stats), over HTTP.

The page in a real browser is tests/gateway/test_ui_browser.py; these check the
endpoints it reads: shapes, auth, `[ui] enabled`, that a dry run forwards
nothing and leaves the policy as it was, and that nothing of it is logged.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from classifier.router import ProfiledPolicy
from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.config import UiConfig, parse_config
from gateway.state import BACKENDS, METRICS, RUNTIME
from tests.gateway.conftest import ClientFactory, GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_routing import SCHEMA, chat
from tests.support import wait_until
from tooling.local_stack import local_stack

Client = TestClient[web.Request, web.Application]
GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
STATIC = GATEWAY / "ui" / "static"
SCHEMAS = json.loads((GATEWAY / "openapi.json").read_text())["components"]["schemas"]
STRUCTURED = chat(
    "Extract the person as JSON: Ada, 36.",
    temperature=0,
    max_tokens=64,
    response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
)


def conforms(payload: dict[str, Any], schema: str) -> None:
    """`payload` is what gateway/openapi.json says the endpoint answers."""
    root = {"$ref": f"#/components/schemas/{schema}", "components": {"schemas": SCHEMAS}}
    jsonschema.Draft202012Validator(root).validate(payload)


async def test_the_page_and_its_two_files_are_served_from_the_package(gateway: Client) -> None:
    page = await gateway.get("/ui")
    assert page.status == 200 and page.content_type == "text/html"
    html = await page.text()
    assert '<script src="/ui/app.js"' in html and 'href="/ui/style.css"' in html
    csp = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        resp = await gateway.get(f"/ui/{name}")
        assert resp.status == 200 and resp.content_type == kind
        assert await resp.read() == (STATIC / name).read_bytes()
    missing = await gateway.get("/ui/secrets.txt")
    assert missing.status == 404
    assert (await missing.json())["error"]["type"] == "not_found_error"


def test_the_page_loads_nothing_from_elsewhere() -> None:
    """Offline: no CDN, no font or script from another host, no storage of the key."""
    for path in STATIC.iterdir():
        text = path.read_text()
        assert not re.search(r"https?://|//cdn|@import|url\(", text), path.name
        assert "localStorage" not in text and "sessionStorage" not in text, path.name
        assert "document.cookie" not in text, path.name


async def test_ui_enabled_false_turns_the_page_off_and_a_reload_back_on(
    gateway_for: GatewayFactory,
) -> None:
    gateway = await gateway_for(ui={"enabled": False})
    assert (await gateway.get("/ui")).status == 404
    assert (await gateway.get("/ui/app.js")).status == 404
    # The API endpoints stay: they are not the page.
    assert (await gateway.post("/decide/v1/chat/completions", json=chat("hi"))).status == 200
    assert (await gateway.get("/stats")).status == 200
    runtime = gateway.app[RUNTIME]
    runtime.reload(dataclasses.replace(runtime.current.config, ui=UiConfig(enabled=True)))
    assert (await gateway.get("/ui")).status == 200


async def test_with_auth_the_page_loads_and_everything_it_reads_needs_a_key(
    aiohttp_client: ClientFactory,
    spec_server: TestServer,
    base_server: TestServer,
    tokens: TokenCounter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("UI_TEST_KEYS", "the-key")
    raw = {
        "backends": {
            "speculative": {"urls": [str(spec_server.make_url(""))]},
            "baseline": {"urls": [str(base_server.make_url(""))]},
        },
        "auth": {"api_keys_env": "UI_TEST_KEYS"},
    }
    locked = await aiohttp_client(create_app(parse_config(raw), tokens=tokens))
    for path in ("/ui", "/ui/app.js", "/ui/style.css"):  # static, no data: a browser sends no key
        assert (await locked.get(path)).status == 200, path
    assert (await locked.get("/uinformation")).status == 401  # only the page's own paths
    key = {"Authorization": "Bearer the-key"}
    for method, path, body in (
        ("POST", "/decide/v1/chat/completions", chat("hi")),
        ("POST", "/decide/v1/completions", {"prompt": "hi"}),
        ("GET", "/stats", None),
        ("POST", "/v1/chat/completions", chat("hi")),
    ):
        refused = await locked.request(method, path, json=body)
        assert refused.status == 401, path
        assert (await locked.request(method, path, json=body, headers=key)).status == 200, path


async def test_a_dry_run_forwards_nothing_and_leaves_the_policy_as_it_was(
    gateway_for: GatewayFactory, spec_upstream: FakeUpstream, base_upstream: FakeUpstream
) -> None:
    gateway = await gateway_for(routing={"policy": "profiled"})
    policy = gateway.app[RUNTIME].current.policy
    assert isinstance(policy, ProfiledPolicy)
    learned = policy.state_to_json()
    decisions = gateway.app[METRICS].decisions
    for _ in range(3):
        resp = await gateway.post("/decide/v1/chat/completions", json=STRUCTURED)
        assert resp.status == 200
        got = await resp.json()
    conforms(got, "Decision")
    assert spec_upstream.received == [] and base_upstream.received == []
    assert policy.state_to_json() == learned  # decide() wrote nothing
    assert list(next(iter(decisions.collect())).samples) == []
    assert got["object"] == "specroute.decision" and got["forwarded"] is False
    assert got["policy"] == "profiled"
    assert got["route"] == "speculative" and got["reason"] == "unprofiled"  # fakes: no profile
    # The two-route config's answer: its routes by name, their figures keyed so.
    assert got["routes"] == [
        {"name": "speculative", "method": "draft_model", "num_speculative_tokens": 4},
        {"name": "baseline", "method": "none", "num_speculative_tokens": 0},
    ]
    predicted = got["predicted_s"]
    assert list(predicted) == ["speculative", "baseline"]
    assert got["speedup_over"] == "baseline"
    assert got["predicted_speedup"] == {
        "speculative": pytest.approx(predicted["baseline"] / predicted["speculative"], rel=1e-3),
        "baseline": 1.0,
    }
    assert got["features"]["workload"] == "structured" and got["features"]["structured"] is True
    assert got["features"]["temperature"] == 0 and got["features"]["max_tokens"] == 64
    assert list(got["acceptance"]) == ["speculative"]  # the speculative routes only
    acceptance = got["acceptance"]["speculative"]
    assert acceptance["workload"] == "structured" and 0 < acceptance["rate"] < 1
    assert acceptance["rate"] == pytest.approx(got["why"]["acceptance"]["speculative"], abs=1e-4)
    assert acceptance["num_speculative_tokens"] == 4
    assert list(got["why"]["cost_s"]) == ["speculative", "baseline"]
    assert list(got["backends"]) == ["speculative", "baseline"]
    assert got["backends"]["speculative"]["inflight"] == 0
    # What the dry run said is what the gateway then does with the same body.
    real = await gateway.post("/v1/chat/completions", json=STRUCTURED)
    assert real.status == 200
    assert real.headers["x-specroute-route"] == got["route"]
    assert real.headers["x-specroute-reason"] == got["reason"]
    assert policy.state_to_json() != learned  # the real one taught the policy


async def test_a_dry_run_of_a_completion_under_the_rules_has_no_predictions(
    gateway: Client,
) -> None:
    resp = await gateway.post(
        "/decide/v1/completions", json={"prompt": "Once upon a time", "temperature": 1.3}
    )
    assert resp.status == 200
    got = await resp.json()
    conforms(got, "Decision")
    assert got["policy"] == "rules" and got["route"] == "baseline"
    assert got["reason"] == "high-temperature"
    assert got["predicted_s"] is None and got["predicted_speedup"] is None
    assert got["features"]["endpoint"] == "completions"
    assert got["acceptance"]["speculative"]["rate"] is None  # the rules believe nothing


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (chat("hi", temperature=-1), "'temperature' must be >= 0"),
        ({"model": "m"}, "'messages' is a required property"),
        (chat("hi", response_format={"type": 5}), "'response_format.type' must be a string"),
    ],
)
async def test_a_dry_run_refuses_what_the_gateway_refuses(
    gateway: Client, body: dict[str, Any], message: str
) -> None:
    for path in ("/decide/v1/chat/completions", "/v1/chat/completions"):
        resp = await gateway.post(path, json=body)
        assert resp.status == 400, path
        assert (await resp.json())["error"]["message"] == message
    not_json = await gateway.post("/decide/v1/chat/completions", data=b"{", headers=_JSON)
    assert not_json.status == 400
    wrong_type = await gateway.post(
        "/decide/v1/chat/completions", data=b"{}", headers={"Content-Type": "text/plain"}
    )
    assert wrong_type.status == 415


_JSON = {"Content-Type": "application/json"}


async def test_nothing_from_the_page_is_logged_beyond_the_usual_request_line(
    gateway: Client,
) -> None:
    secret = "my-very-private-prompt-7781"
    pool = gateway.app[BACKENDS]  # the prober's first read of the models logs once: before
    await wait_until(lambda: all(u.models for b in pool for u in b.upstreams), "models read")
    with capture_logs() as logs:
        assert (await gateway.get("/ui")).status == 200
        assert (await gateway.get("/ui/app.js")).status == 200
        assert (await gateway.get("/stats")).status == 200
        assert (await gateway.post("/decide/v1/chat/completions", json=chat(secret))).status == 200
    assert logs == []
    with capture_logs() as logs:
        resp = await gateway.post(
            "/v1/chat/completions",
            json=chat(secret, stream=True, stream_options={"include_usage": True}),
            headers={"x-specroute-route": "speculative"},
        )
        assert resp.status == 200
        await resp.read()
    assert [entry["event"] for entry in logs].count("request") == 1
    assert secret not in repr(logs)


async def test_stats_has_the_route_mix_acceptance_and_no_speedup_yet(
    tokens: TokenCounter,
) -> None:
    async with (
        local_stack(time_scale=0.05, tokens=tokens) as stack,
        aiohttp.ClientSession() as session,
    ):
        for route in ("speculative", "speculative", "baseline"):
            async with session.post(
                f"{stack.gateway}/v1/chat/completions",
                json={**STRUCTURED, "model": "emulated-model", "stream": True},
                headers={"x-specroute-route": route},
            ) as resp:
                assert resp.status == 200
                await resp.read()
        async with session.get(f"{stack.gateway}/stats") as resp:
            assert resp.status == 200
            stats = await resp.json()
    conforms(stats, "Stats")
    assert stats["object"] == "specroute.stats" and stats["policy"] == "profiled"
    assert [r["name"] for r in stats["routes"]] == ["speculative", "baseline"]
    assert stats["requests"] == {"baseline": 3 - 2, "speculative": 2}
    assert stats["reasons"] == {"override": 3}
    structured = stats["workloads"]["structured"]
    assert structured["requests"] == {"speculative": 2, "baseline": 1}
    assert all(s > 0 for s in structured["e2e_mean_s"].values())
    assert list(structured["acceptance"]) == ["speculative"]  # the speculative routes only
    acceptance = structured["acceptance"]["speculative"]
    assert acceptance["num_speculative_tokens"] == stats["routes"][0]["num_speculative_tokens"]
    assert acceptance["measured_requests"] == 2  # the speculative answers only
    assert 0 < acceptance["measured_rate"] < 1
    assert acceptance["sources"] == ["per_request_metrics"]  # the emulator reports them
    assert 0 < acceptance["believed_rate"] < 1
    assert structured["speedup"] is None
    assert stats["speedup"]["value"] is None and "shadow" in stats["speedup"]["why"]
    assert stats["workloads"]["creative"]["acceptance"]["speculative"]["measured_rate"] is None
    assert stats["workloads"]["creative"]["e2e_mean_s"] == {"speculative": None, "baseline": None}
    backends = stats["backends"]
    assert backends["speculative"]["healthy"] and backends["baseline"]["reachable"]
    assert backends["speculative"]["inflight"] == 0
