"""Which metric names the PromQL in deploy/ uses, and which ones exist.

Expressions are parsed with a real PromQL parser (promql-parser, the Rust
parser Greptime maintains, with Python bindings); every vector selector's
metric name is collected, including `{__name__="..."}` selectors. Grafana's
macros ($__rate_interval) and variables ($workload) are replaced first by
values the parser accepts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import promql_parser
import yaml

from tests.deploy.conftest import DEPLOY

RULES = sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))

# The metrics that exist today (the gateway's, and vLLM 0.32's v1 engine names),
# by type, as the issue lists them. Later metrics must not appear in deploy/
# before they exist.
GATEWAY_METRICS = {
    "specroute_requests": "counter",
    "specroute_route_decisions": "counter",
    "specroute_request_duration_seconds": "histogram",
    "specroute_time_to_first_token_seconds": "histogram",
    "specroute_time_per_output_token_seconds": "histogram",
    "specroute_output_tokens": "counter",
    "specroute_slo_requests": "counter",
    "specroute_inflight_requests": "gauge",
    "specroute_prefill_pending_tokens": "gauge",
    "specroute_upstream_errors": "counter",
    "specroute_backend_up": "gauge",
    "specroute_endpoint_up": "gauge",
    "specroute_endpoint_ejections": "counter",
    "specroute_build_info": "gauge",
    "specroute_failovers": "counter",
    "specroute_spec_acceptance_ratio": "histogram",
    "specroute_estimated_acceptance_ratio": "gauge",
    "specroute_gpu_shared": "gauge",
    "specroute_latency_prediction_ratio": "histogram",
    "specroute_backend_running": "gauge",
    "specroute_backend_waiting": "gauge",
    "specroute_backend_kv_cache_usage_ratio": "gauge",
    "specroute_backend_spec_acceptance_ratio": "gauge",
    "specroute_backend_spec_mean_acceptance_length": "gauge",
    "specroute_attributed_acceptance_ratio": "gauge",
    "specroute_attributed_draft_tokens": "gauge",
    "specroute_attribution_windows": "counter",
    "specroute_acceptance_source": "gauge",
    "specroute_shadow_requests": "counter",
    "specroute_shadow_inflight": "gauge",
    "specroute_shadow_paired_seconds": "counter",
    "specroute_shadow_speedup": "gauge",
    "specroute_shadow_regret": "gauge",
}
VLLM_METRICS = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_success": "counter",
    "vllm:spec_decode_num_drafts": "counter",
    "vllm:spec_decode_num_draft_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "counter",
}
# Series Prometheus makes itself.
PROMETHEUS_SYNTHETIC = {"up"}


def sample_names(family: str, kind: str) -> set[str]:
    """The series names a metric family of this type exposes."""
    if kind == "counter":
        return {family if family.endswith("_total") else f"{family}_total"}
    if kind == "histogram":
        return {f"{family}_bucket", f"{family}_sum", f"{family}_count"}
    if kind == "summary":
        return {family, f"{family}_sum", f"{family}_count"}
    return {family}


def names_of(metrics: dict[str, str]) -> set[str]:
    return {n for family, kind in metrics.items() for n in sample_names(family, kind)}


ALLOWED = names_of(GATEWAY_METRICS) | names_of(VLLM_METRICS) | PROMETHEUS_SYNTHETIC

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]")
_TYPE = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\w+)")


def exposed_names(text: str) -> set[str]:
    """Series names in a Prometheus text exposition: the samples, plus what each
    declared family would expose (a labelled metric with no sample yet still counts)."""
    names: set[str] = set()
    for line in text.splitlines():
        if m := _TYPE.match(line):
            names |= sample_names(m.group(1), m.group(2))
        elif m := _SAMPLE.match(line):
            names.add(m.group(1))
    return names


_GRAFANA_MACROS = re.compile(
    r"\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}"
)
_GRAFANA_VARS = re.compile(r"\$\{?(\w+)\}?")


def grafana_to_promql(expr: str) -> str:
    """Grafana's macros and variables -> values the PromQL parser accepts."""
    expr = _GRAFANA_MACROS.sub("5m", expr)
    return _GRAFANA_VARS.sub(".*", expr)


def metric_names(expr: str) -> set[str]:
    """Metric names of every vector selector in a PromQL expression."""
    found: set[str] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                found.add(node.name)
            for m in node.matchers.matchers:
                if m.name == "__name__":
                    found.add(m.value)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def _names_under(node: Any) -> set[str]:
    found: set[str] = set()

    def visit(n: Any) -> bool:
        if isinstance(n, promql_parser.VectorSelector) and n.name:
            found.add(n.name)
        return True

    promql_parser.walk(node, visit)
    return found


def label_uses(expr: str) -> list[tuple[str, frozenset[str]]]:
    """(label, the metric names it applies to) for every label an expression names:
    a selector's matchers, an aggregation's by/without, a binary operator's on/ignoring
    and group_left/right."""
    uses: list[tuple[str, frozenset[str]]] = []

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            for m in node.matchers.matchers:
                if m.name != "__name__" and node.name:
                    uses.append((m.name, frozenset({node.name})))
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            under = frozenset(_names_under(node.expr))
            uses.extend((label, under) for label in node.modifier.labels)
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            under = frozenset(_names_under(node.lhs) | _names_under(node.rhs))
            matching = node.modifier.matching
            labels = [*(matching.labels if matching is not None else [])]
            labels += list(node.modifier.group_labels or [])
            uses.extend((label, under) for label in labels)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return uses


def rule_expressions() -> Iterator[tuple[str, str]]:
    """(where, expr) for every rule of every rules file."""
    for path in RULES:
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                name = rule.get("alert") or rule.get("record")
                yield f"{path.name}:{name}", rule["expr"]


_LABEL_VALUES = re.compile(r"label_values\(\s*([^,)]+?)\s*(?:,\s*\w+\s*)?\)")


def dashboard_expressions() -> Iterator[tuple[str, str]]:
    """(where, expr) for every panel target and every query variable of the dashboards.

    label_values(SELECTOR, label) is Grafana's, not PromQL: its selector is
    returned as the expression."""
    for path in DASHBOARDS:
        dash = json.loads(path.read_text())
        for panel in _panels(dash["panels"]):
            for target in panel.get("targets", []):
                yield (
                    f"{path.name}:{panel['title']}:{target['refId']}",
                    grafana_to_promql(target["expr"]),
                )
        for var in dash.get("templating", {}).get("list", []):
            if var.get("type") != "query":
                continue
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = _LABEL_VALUES.fullmatch(query.strip())
            expr = m.group(1) if m else query
            yield f"{path.name}:${var['name']}", grafana_to_promql(expr)


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def all_expressions() -> list[tuple[str, str]]:
    return [*rule_expressions(), *dashboard_expressions()]
