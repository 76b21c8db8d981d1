"""Every PromQL expression in the alert rules and the dashboard names only
metrics that exist: the gateway's and vLLM's current ones (not deprecated
vLLM names, not gateway metrics that are still to come). Checked against the
issue's list, a real scrape of the gateway, a scrape of the emulator, and the
scrapes of a real vLLM 0.32 CPU pair saved in deploy/cpu/fixtures/. Every label
an expression names on the gateway's metrics (matchers, by/without, on/group_left)
is one of those metrics' labels (a route is `route` everywhere)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client.metrics import MetricWrapperBase

from gateway.app import create_app
from gateway.config import parse_config
from gateway.telemetry import Metrics
from tests.deploy.conftest import DEPLOY
from tests.deploy.promql_names import (
    ALLOWED,
    GATEWAY_METRICS,
    VLLM_METRICS,
    all_expressions,
    exposed_names,
    label_uses,
    metric_names,
    names_of,
    sample_names,
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


# Labels Prometheus adds to every series of a target (the scrape configs' relabelling).
TARGET_LABELS = {"job", "instance", "pod", "namespace"}


def gateway_labels() -> dict[str, set[str]]:
    """Series name -> its label names, for every metric the gateway defines."""
    out: dict[str, set[str]] = {}
    for metric in vars(Metrics()).values():
        if isinstance(metric, MetricWrapperBase):
            for name in sample_names(metric._name, str(metric._type)):
                out[name] = set(metric._labelnames) | (
                    {"le"} if name.endswith("_bucket") else set()
                )
    return out


LABELS = gateway_labels()


def unknown_labels(expr: str) -> list[tuple[str, list[str]]]:
    """(label, metrics) where an expression names a label that none of the gateway
    metrics it applies to has (vLLM's metrics and mixed expressions are not judged)."""
    wrong = []
    for label, names in label_uses(expr):
        if not names or not all(n in LABELS for n in names) or label in TARGET_LABELS:
            continue
        if not any(label in LABELS[n] for n in names):
            wrong.append((label, sorted(names)))
    return wrong


@pytest.mark.parametrize(("where", "expr"), EXPRESSIONS, ids=[w for w, _ in EXPRESSIONS])
def test_expression_names_only_labels_the_gateway_exports(where: str, expr: str) -> None:
    assert not unknown_labels(expr), f"{where}: {unknown_labels(expr)} in {expr!r}"


def test_the_label_check_judges() -> None:
    assert "specroute_upstream_errors_total" in LABELS
    assert unknown_labels("sum by (backend) (specroute_inflight_requests)") == [
        ("backend", ["specroute_inflight_requests"])
    ]
    assert unknown_labels('specroute_backend_up{backend="baseline"} == 0')
    assert unknown_labels("a / on (backend) specroute_endpoint_up") == []  # mixed: not judged
    assert not unknown_labels("sum by (route, url) (specroute_endpoint_up)")
    assert not unknown_labels(
        "sum by (route, le) (rate(specroute_request_duration_seconds_bucket[5m]))"
    )
    # Every label the rules' annotations print ($labels.X) is one the expression keeps.
    used = {label for _, expr in EXPRESSIONS for label, _ in label_uses(expr)}
    assert {"route", "url", "kind", "workload"} <= used
    assert not {n for n, labels in LABELS.items() if "backend" in labels}


@pytest.mark.parametrize(("where", "expr"), EXPRESSIONS, ids=[w for w, _ in EXPRESSIONS])
def test_no_expression_names_a_route(where: str, expr: str) -> None:
    """Routes are configured names (none, ngram-k2, eagle3-k3...): an expression groups
    or joins by `route`, and tells a speculative route by its vLLM server's spec_decode
    counters, never by matching a route's name."""
    matchers = re.findall(r'\broute\s*(=~|!~|!=|=)\s*"([^"]*)"', expr)
    assert not matchers, f"{where}: matches route names {matchers}"
