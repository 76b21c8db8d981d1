"""deploy/grafana: the dashboard JSON is build_dashboard.py's output, its
panels are well formed and lie on Grafana's 24-column grid without overlap,
and it has the panels the issue asks for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from deploy.grafana import build_dashboard
from tests.deploy.conftest import DEPLOY, run
from tests.support import require_tool

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "specroute.json"


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())  # type: ignore[no-any-return]


def test_the_json_is_the_generators_output() -> None:
    assert DASHBOARD.read_text() == build_dashboard.render(), (
        "run: python3 deploy/grafana/build_dashboard.py"
    )


def test_panels_are_well_formed_and_do_not_overlap() -> None:
    dash = load()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] in ("timeseries", "stat"):
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert p["targets"], p["title"]
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs))
            assert p["fieldConfig"]["defaults"]["unit"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["workload"]["includeAll"] is True


def test_the_panels_the_issue_lists() -> None:
    dash = load()
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
    titles = " ".join(p["title"] for p in dash["panels"])
    # p50/p95 TTFT, time per output token and e2e, by route and by workload.
    for metric in (
        "specroute_time_to_first_token_seconds_bucket",
        "specroute_time_per_output_token_seconds_bucket",
        "specroute_request_duration_seconds_bucket",
    ):
        for by in ("sum by (route, le)", "sum by (workload, route, le)"):
            for q in ("histogram_quantile(0.5, ", "histogram_quantile(0.95, "):
                assert f"{q}{by} (rate({metric}" in exprs, (q, by, metric)
    # Route mix and reasons.
    assert "sum by (route, reason) (rate(specroute_route_decisions_total" in exprs
    # Acceptance rate and mean acceptance length from vLLM's counters.
    assert "rate(vllm:spec_decode_num_accepted_tokens_total" in exprs
    assert "/ sum by (route, instance) (rate(vllm:spec_decode_num_draft_tokens_total" in exprs
    assert "1 + sum by (route, instance) (rate(vllm:spec_decode_num_accepted_tokens_total" in exprs
    # Backend running / waiting / KV usage, and errors.
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "specroute_upstream_errors_total",
    ):
        assert name in exprs
    # The router: per-request acceptance by workload, its estimate, prediction error.
    for name in (
        "specroute_spec_acceptance_ratio_sum",
        "specroute_estimated_acceptance_ratio",
        "specroute_latency_prediction_ratio_bucket",
        "specroute_backend_kv_cache_usage_ratio",
        "specroute_failovers_total",
    ):
        assert name in exprs
    assert "Estimated acceptance a (the router's belief)" in titles


SPEEDUP = "Speculation speedup by workload and route (median TPOT without / with)"
# Three routes over 10 min: none decodes at 5 ms per token, ngram-k2 at 5 ms,
# eagle3-k3 at 25 ms (buckets: all of none's and ngram-k2's under 10 ms, all of
# eagle3-k3's in 20-30 ms); only the two speculative servers export vLLM's drafts.
_SPEEDUP_SERIES = """
      - series: 'specroute_time_per_output_token_seconds_bucket{route="none", workload="chat", le="0.01"}'
        values: "0+10x10"
      - series: 'specroute_time_per_output_token_seconds_bucket{route="none", workload="chat", le="+Inf"}'
        values: "0+10x10"
      - series: 'specroute_time_per_output_token_seconds_bucket{route="ngram-k2", workload="chat", le="0.01"}'
        values: "0+10x10"
      - series: 'specroute_time_per_output_token_seconds_bucket{route="ngram-k2", workload="chat", le="+Inf"}'
        values: "0+10x10"
      - series: 'specroute_time_per_output_token_seconds_bucket{route="eagle3-k3", workload="chat", le="0.02"}'
        values: "0x10"
      - series: 'specroute_time_per_output_token_seconds_bucket{route="eagle3-k3", workload="chat", le="0.03"}'
        values: "0+10x10"
      - series: 'specroute_time_per_output_token_seconds_bucket{route="eagle3-k3", workload="chat", le="+Inf"}'
        values: "0+10x10"
      - series: 'vllm:spec_decode_num_drafts_total{job="vllm", route="ngram-k2", instance="n:8000"}'
        values: "0+100x10"
      - series: 'vllm:spec_decode_num_drafts_total{job="vllm", route="eagle3-k3", instance="e:8000"}'
        values: "0+100x10"
"""


def test_the_speedup_panel_works_for_any_route_names(tmp_path: Path) -> None:
    """Evaluated by Prometheus itself (promtool's rule tests), on three routes named as
    no panel knows: one value per speculative route, none for the plain one."""
    promtool = require_tool("promtool", "scripts/test.sh apt-installs prometheus")
    (panel,) = [p for p in load()["panels"] if p["title"] == SPEEDUP]
    expr = panel["targets"][0]["expr"].replace("$__rate_interval", "5m")
    expr = expr.replace('workload=~"$workload"', 'workload=~".*"')
    rules = {"groups": [{"name": "speedup", "rules": [{"record": "speedup", "expr": expr}]}]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    (tmp_path / "test.yml").write_text(
        "rule_files: [rules.yml]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n"
        f"    input_series:{_SPEEDUP_SERIES}"
        "    promql_expr_test:\n      - expr: round(speedup, 0.001)\n        eval_time: 10m\n"
        "        exp_samples:\n"
        '          - labels: \'{route="ngram-k2", workload="chat"}\'\n'
        "            value: 1\n"
        '          - labels: \'{route="eagle3-k3", workload="chat"}\'\n'
        "            value: 0.2\n"
    )
    res = run([promtool, "test", "rules", "test.yml"], cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
