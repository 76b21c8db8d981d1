"""Every PromQL expression in the alert rules and the dashboard names only
metrics that exist: the gateway's and vLLM's current ones (not deprecated
vLLM names, not gateway metrics that are still to come). Checked against the
issue's list, a real scrape of the gateway, a scrape of the emulator, and the
scrapes of a real vLLM 0.32 CPU pair saved in deploy/cpu/fixtures/."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from gateway.app import create_app
from gateway.config import parse_config
from tests.deploy.conftest import DEPLOY
from tests.deploy.promql_names import (
    ALLOWED,
    GATEWAY_METRICS,
    VLLM_METRICS,
    all_expressions,
    exposed_names,
    metric_names,
    names_of,
)
from tooling.emulator import EmulatorConfig, create_emulator_app

ClientFactory = Callable[[web.Application], Awaitable[TestClient[Any, Any]]]
EXPRESSIONS = all_expressions()
USED = set().union(*(metric_names(expr) for _, expr in EXPRESSIONS))
FIXTURES = DEPLOY / "cpu" / "fixtures"


def test_the_rules_and_the_dashboard_have_expressions() -> None:
    where = {w.split(":")[0] for w, _ in EXPRESSIONS}
    assert {"specroute-alerts.yml", "specroute.json"} <= where
    assert len(EXPRESSIONS) > 30


@pytest.mark.parametrize(("where", "expr"), EXPRESSIONS, ids=[w for w, _ in EXPRESSIONS])
def test_expression_parses_and_names_only_existing_metrics(where: str, expr: str) -> None:
    names = metric_names(expr)  # raises on a PromQL syntax error
    assert names, f"{where}: no metric in {expr!r}"
    unknown = names - ALLOWED
    assert not unknown, f"{where}: {sorted(unknown)} are not exported by the gateway or vLLM"


def test_both_sources_are_used() -> None:
    assert USED & names_of(GATEWAY_METRICS)
    assert USED & names_of(VLLM_METRICS)
    # The acceptance formulas need all three spec-decode counters.
    assert {
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    } <= USED


async def test_gateway_names_exist_in_a_real_gateway_scrape(
    aiohttp_client: ClientFactory,
) -> None:
    config = parse_config(
        {
            "backends": {
                "speculative": {"urls": ["http://127.0.0.1:9"]},
                "baseline": {"urls": ["http://127.0.0.1:9"]},
            }
        }
    )
    client = await aiohttp_client(create_app(config))
    resp = await client.get("/metrics")
    assert resp.status == 200
    exposed = exposed_names(await resp.text())
    used = {n for n in USED if n.startswith("specroute_")}
    assert used, "the deploy files use no gateway metric"
    assert used <= exposed, f"missing from the gateway's /metrics: {sorted(used - exposed)}"


async def test_vllm_names_exist_in_the_emulator_scrape(aiohttp_client: ClientFactory) -> None:
    used = {n for n in USED if n.startswith("vllm:")}
    for mode in ("speculative", "baseline"):
        app = create_emulator_app(EmulatorConfig(mode=mode, model="m", time_scale=0.01))
        client = await aiohttp_client(app)
        resp = await client.get("/metrics")
        assert resp.status == 200
        exposed = exposed_names(await resp.text())
        expected = used if mode == "speculative" else {n for n in used if "spec_decode" not in n}
        missing = expected - exposed
        assert not missing, f"missing from the emulator's {mode} /metrics: {sorted(missing)}"


@pytest.mark.parametrize("mode", ["speculative", "baseline"])
def test_vllm_names_exist_in_a_real_vllm_scrape(mode: str) -> None:
    path = FIXTURES / f"metrics_{mode}.txt"
    assert path.is_file(), f"{path} (a real vLLM scrape, committed) is missing"
    exposed = exposed_names(path.read_text())
    used = {n for n in USED if n.startswith("vllm:")}
    if mode == "baseline":  # no spec_decode_* without --speculative-config
        used = {n for n in used if "spec_decode" not in n}
    missing = used - exposed
    assert not missing, f"missing from real vLLM's {mode} /metrics: {sorted(missing)}"


def test_the_checker_rejects_unknown_and_deprecated_names() -> None:
    # vLLM's own example dashboard still shows these; they are gone from the v1 engine.
    for old in (
        "vllm:gpu_cache_usage_perc",
        "vllm:num_requests_swapped",
        "vllm:time_per_output_token_seconds_bucket",
        "vllm:spec_decode_draft_acceptance_rate",
    ):
        assert metric_names(f"avg({old})") == {old}
        assert old not in ALLOWED
    with pytest.raises(ValueError):
        metric_names("sum(rate(x[5m])")
