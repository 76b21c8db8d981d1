"""Latency targets per request: llm-d's SLO headers and their aliases, the model's
configured default, a clear 400 for a bad value, the answer's header, and goodput
(specroute_slo_requests_total) measured on streamed answers, unmeasured on whole ones.

Real servers on 127.0.0.1: the fake vLLM upstreams and the gateway (rules policy, which
predicts nothing: its answers say "unknown"; the cost model's pick, met and unmet, has
its tests in tests/classifier/test_targets.py)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from tests.gateway.conftest import GatewayFactory
from tests.gateway.test_observability import samples

Client = TestClient[web.Request, web.Application]
SLO = "specroute_slo_requests_total"
HEADER = "x-specroute-slo-predicted"


def chat(*, stream: bool = True) -> dict[str, Any]:
    return {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "hi there"}],
        "temperature": 0.2,
        "stream": stream,
    }


def goodput(text: str) -> dict[tuple[str, str, str], float]:
    """(route, target, outcome) -> requests, over workloads."""
    out: dict[tuple[str, str, str], float] = {}
    for (name, labels), value in samples(text).items():
        if name == SLO:
            got = dict(labels)
            key = (got["route"], got["target"], got["outcome"])
            out[key] = out.get(key, 0.0) + value
    return out


@pytest.mark.parametrize("name", ["x-llm-d-slo-ttft-ms", "x-slo-ttft-ms", "x-llm-d-slo-tpot-ms"])
@pytest.mark.parametrize(
    "value", ["abc", "-5", "nan", "NaN", "inf", "1e400", "1e3", "99999999", "3600001", "", "2_0"]
)
async def test_a_bad_target_is_a_400_in_openais_shape(
    gateway_for: GatewayFactory, name: str, value: str
) -> None:
    gateway = await gateway_for()
    for path in ("/v1/chat/completions", "/decide/v1/chat/completions"):
        resp = await gateway.post(path, json=chat(), headers={name: value})
        assert resp.status == 400, (path, value)
        error = (await resp.json())["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"] == name
        assert error["message"].startswith(f"{name} must be a number of milliseconds")


async def test_a_long_bad_value_is_cut_in_the_message(gateway_for: GatewayFactory) -> None:
    gateway = await gateway_for()
    resp = await gateway.post(
        "/v1/chat/completions", json=chat(), headers={"x-llm-d-slo-ttft-ms": "9" * 500}
    )
    assert resp.status == 400
    assert len((await resp.json())["error"]["message"]) < 200


async def test_streamed_answers_count_met_and_missed_per_target(
    gateway_for: GatewayFactory,
) -> None:
    gateway = await gateway_for()
    # A minute is met; 0 (as soon as possible: 1 microsecond) is missed.
    loose = {"x-llm-d-slo-ttft-ms": "60000", "x-llm-d-slo-tpot-ms": "60000.5"}
    resp = await gateway.post("/v1/chat/completions", json=chat(), headers=loose)
    assert resp.status == 200
    assert resp.headers[HEADER] == "unknown"  # the rules policy predicts nothing
    await resp.read()
    with capture_logs() as logs:
        resp = await gateway.post(
            "/v1/chat/completions", json=chat(), headers={"x-slo-ttft-ms": "0"}
        )
        await resp.read()
    line = next(entry for entry in logs if entry["event"] == "request")
    assert line["slo"] == {"ttft": "missed"}
    # No target: no header, nothing counted.
    resp = await gateway.post("/v1/chat/completions", json=chat())
    assert HEADER not in resp.headers
    await resp.read()
    counts = goodput(await (await gateway.get("/metrics")).text())
    route = resp.headers["x-specroute-route"]
    assert counts == {
        (route, "ttft", "met"): 1,
        (route, "tpot", "met"): 1,
        (route, "ttft", "missed"): 1,
    }


async def test_whole_answers_are_unmeasured(gateway_for: GatewayFactory) -> None:
    gateway = await gateway_for()
    resp = await gateway.post(
        "/v1/chat/completions",
        json=chat(stream=False),
        headers={"x-llm-d-slo-ttft-ms": "200", "x-llm-d-slo-tpot-ms": "50"},
    )
    assert resp.status == 200
    await resp.read()
    route = resp.headers["x-specroute-route"]
    counts = goodput(await (await gateway.get("/metrics")).text())
    assert counts == {(route, "ttft", "unmeasured"): 1, (route, "tpot", "unmeasured"): 1}


async def test_the_models_default_and_the_headers_each_replacing_its_own(
    gateway_for: GatewayFactory,
) -> None:
    gateway = await gateway_for(
        latency_targets={"fake-model": {"ttft_ms": 60000}, "*": {"tpot_ms": 0.0001}}
    )
    decide = "/decide/v1/chat/completions"
    features = (await (await gateway.post(decide, json=chat())).json())["features"]
    assert features["targets"] == {"ttft_s": 60.0, "tpot_s": None}  # its model's table
    other = {**chat(), "model": "another"}
    features = (await (await gateway.post(decide, json=other)).json())["features"]
    assert features["targets"] == {"ttft_s": None, "tpot_s": pytest.approx(1e-7)}  # "*"
    headers = {"x-llm-d-slo-tpot-ms": "60000"}
    features = (await (await gateway.post(decide, json=chat(), headers=headers)).json())["features"]
    assert features["targets"] == {"ttft_s": 60.0, "tpot_s": 60.0}
    # Both llm-d's name and its alias: llm-d's.
    headers = {"x-llm-d-slo-ttft-ms": "100", "x-slo-ttft-ms": "bad"}
    features = (await (await gateway.post(decide, json=chat(), headers=headers)).json())["features"]
    assert features["targets"]["ttft_s"] == pytest.approx(0.1)
    resp = await gateway.post("/v1/chat/completions", json=chat())
    assert resp.headers[HEADER] == "unknown"
    await resp.read()
    route = resp.headers["x-specroute-route"]
    counts = goodput(await (await gateway.get("/metrics")).text())
    assert counts == {(route, "ttft", "met"): 1}


async def test_without_targets_the_features_have_none(gateway_for: GatewayFactory) -> None:
    gateway = await gateway_for()
    answer = await (await gateway.post("/decide/v1/chat/completions", json=chat())).json()
    assert answer["features"]["targets"] is None
