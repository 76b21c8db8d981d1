"""Writes deploy/grafana/dashboards/specroute.json, the specroute Grafana dashboard.

The JSON is generated so that every panel has the same shape, ids and grid
positions never collide, and the PromQL lives in one readable place. Edit this
file, run it, commit both (tests/deploy checks that they agree):

    python3 deploy/grafana/build_dashboard.py

Only metrics that exist today: the gateway's specroute_* and vLLM's current
(v1 engine) names; not the deprecated ones vLLM's own example dashboard still
shows. vLLM targets carry a `route` label (the route's name: speculative and
baseline for the pair; none, ngram-k2, eagle3-k3, ... for N routes) set by the
Prometheus scrape config. No panel names a route: they group by `route`, and a
route speculates when its vLLM server exports the spec_decode counters (SPECULATES).
Panels for metrics that do not exist yet are listed under "TODO" in deploy/README.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards" / "specroute.json"
UID = "specroute-overview"
DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"
WL = 'workload=~"$workload"'
# The routes whose vLLM servers speculate: only those export vLLM's spec_decode
# counters (deploy/cpu/fixtures: metrics_baseline.txt has none).
SPECULATES = "group by (route) (vllm:spec_decode_num_drafts_total)"


def median_tpot() -> str:
    """Median time per output token by workload and route, summed over replicas."""
    return (
        "histogram_quantile(0.5, sum by (workload, route, le) (rate("
        f"specroute_time_per_output_token_seconds_bucket{{{WL}}}[{RI}])))"
    )


GOODPUT = "Latency targets met (goodput)"


def goodput(by: str) -> str:
    """Met over measured (met or missed) answers with a latency target, per `by`."""
    return (
        f'sum by ({by}) (rate(specroute_slo_requests_total{{outcome="met", {WL}}}[{RI}]))'
        f' / sum by ({by}) (rate(specroute_slo_requests_total{{outcome=~"met|missed", {WL}}}'
        f"[{RI}]))"
    )


def q(expr: str, legend: str = "") -> dict[str, Any]:
    return {"expr": expr, "legendFormat": legend or "__auto"}


def quantiles(metric: str, by: str, sel: str, qs: tuple[float, ...] = (0.5, 0.95)) -> list[Any]:
    """p50/p95 (...) of a histogram, summed over gateway replicas, grouped by `by`."""
    legend_labels = " ".join(f"{{{{{label.strip()}}}}}" for label in by.split(","))
    return [
        q(
            f"histogram_quantile({x}, sum by ({by}, le) (rate({metric}_bucket{{{sel}}}[{RI}])))",
            f"p{round(x * 100)} {legend_labels}",
        )
        for x in qs
    ]


def acceptance(by: str) -> str:
    return (
        f"sum by ({by}) (rate(vllm:spec_decode_num_accepted_tokens_total[{RI}]))"
        f" / sum by ({by}) (rate(vllm:spec_decode_num_draft_tokens_total[{RI}]))"
    )


def mean_acceptance_length(by: str) -> str:
    return (
        f"1 + sum by ({by}) (rate(vllm:spec_decode_num_accepted_tokens_total[{RI}]))"
        f" / sum by ({by}) (rate(vllm:spec_decode_num_drafts_total[{RI}]))"
    )


def shadow_ratio(over: str, under: str) -> str:
    """A ratio of two sides of the shadow pairs' e2e sums, per workload, over 30 min."""
    sums = [
        f'sum by (workload) (increase(specroute_shadow_paired_seconds_total{{side="{side}",'
        f"{WL}}}[30m]))"
        for side in (over, under)
    ]
    return f"{sums[0]} / {sums[1]}"


# (title, panel type, unit, width, targets, description, extra options)
Panel = tuple[str, str, str, int, list[dict[str, Any]], str]

ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Overview",
        [
            (
                "Requests/s",
                "stat",
                "reqps",
                4,
                [q(f"sum(rate(specroute_requests_total[{RI}]))", "requests/s")],
                "Requests answered by the gateway, all replicas.",
            ),
            (
                "Route mix",
                "stat",
                "percentunit",
                4,
                [
                    q(
                        f"sum by (route) (rate(specroute_requests_total[{RI}]))"
                        f" / scalar(sum(rate(specroute_requests_total[{RI}])))",
                        "{{route}}",
                    )
                ],
                "Share of requests each route answered.",
            ),
            (
                "Server errors",
                "stat",
                "percentunit",
                4,
                [
                    q(
                        "sum(rate(specroute_requests_total"
                        f'{{status=~"5xx|stream_error"}}[{RI}]))'
                        " / sum(rate(specroute_requests_total"
                        f'{{status!="client_disconnect"}}[{RI}]))',
                        "5xx + broken streams",
                    )
                ],
                "5xx answers and streams broken after the first byte, among answered requests.",
            ),
            (
                "Backends up (gateway view)",
                "stat",
                "short",
                4,
                [q("min by (route) (specroute_backend_up)", "{{route}}")],
                "1 while at least one server of the route takes requests, on every gateway "
                'replica (per server: the panel "Servers in rotation").',
            ),
            (
                "Draft acceptance",
                "stat",
                "percentunit",
                4,
                [q(acceptance("route"), "{{route}}")],
                "vLLM: accepted / proposed draft tokens, per speculative route.",
            ),
            (
                "Mean acceptance length",
                "stat",
                "short",
                4,
                [q(mean_acceptance_length("route"), "{{route}}")],
                "vLLM: 1 + accepted tokens per draft = tokens the target emits per step.",
            ),
        ],
    ),
    (
        "Routing",
        [
            (
                "Route mix",
                "timeseries",
                "reqps",
                8,
                [q(f"sum by (route) (rate(specroute_requests_total[{RI}]))", "{{route}}")],
                "Requests per second by the route that answered them.",
            ),
            (
                "Decisions by reason",
                "timeseries",
                "reqps",
                8,
                [
                    q(
                        f"sum by (route, reason) (rate(specroute_route_decisions_total[{RI}]))",
                        "{{route}}: {{reason}}",
                    )
                ],
                "Why the router chose each route (rule name, override, fallback).",
            ),
            (
                "Requests by workload",
                "timeseries",
                "reqps",
                8,
                [
                    q(
                        f"sum by (workload, route) (rate(specroute_requests_total{{{WL}}}[{RI}]))",
                        "{{workload}} -> {{route}}",
                    )
                ],
                "Requests per second by workload kind and route.",
            ),
        ],
    ),
    (
        "Latency by route",
        [
            (
                "Time to first token",
                "timeseries",
                "s",
                8,
                quantiles("specroute_time_to_first_token_seconds", "route", WL),
                "p50 and p95 time to first token of streamed answers, seen by the gateway.",
            ),
            (
                "Time per output token",
                "timeseries",
                "s",
                8,
                quantiles("specroute_time_per_output_token_seconds", "route", WL),
                "p50 and p95 time per output token after the first: what speculation speeds up.",
            ),
            (
                "End-to-end latency",
                "timeseries",
                "s",
                8,
                quantiles("specroute_request_duration_seconds", "route", WL),
                "p50 and p95 request duration, seen by the gateway.",
            ),
        ],
    ),
    (
        "Latency by workload",
        [
            (
                "TTFT by workload",
                "timeseries",
                "s",
                8,
                quantiles("specroute_time_to_first_token_seconds", "workload, route", WL),
                "p50 and p95 time to first token per workload and route.",
            ),
            (
                "Time per output token by workload",
                "timeseries",
                "s",
                8,
                quantiles("specroute_time_per_output_token_seconds", "workload, route", WL),
                "p50 and p95 time per output token per workload and route.",
            ),
            (
                "End-to-end latency by workload",
                "timeseries",
                "s",
                8,
                quantiles("specroute_request_duration_seconds", "workload, route", WL),
                "p50 and p95 request duration per workload and route.",
            ),
            (
                "Speculation speedup by workload and route (median TPOT without / with)",
                "timeseries",
                "short",
                12,
                [
                    q(
                        f"min by (workload) ({median_tpot()} unless on (route) {SPECULATES})"
                        f" / on (workload) group_right () ({median_tpot()}"
                        f" and on (route) {SPECULATES})",
                        "{{workload}} {{route}}",
                    )
                ],
                "The fastest route without speculation's median time per output token over each "
                "speculative route's, per workload. Above 1: that route decodes faster. Needs "
                "traffic on both in the workload (plain decoding sees exploration and overflow).",
            ),
            (
                "Output tokens/s by workload",
                "timeseries",
                "short",
                12,
                [
                    q(
                        "sum by (workload, route) (rate(specroute_output_tokens_total"
                        f"{{{WL}}}[{RI}]))",
                        "{{workload}} -> {{route}}",
                    )
                ],
                "Completion tokens per second reported by the backends.",
            ),
        ],
    ),
    (
        "Speculative decoding (vLLM counters)",
        [
            (
                "Acceptance rate per server",
                "timeseries",
                "percentunit",
                6,
                [q(acceptance("route, instance"), "{{route}} {{instance}}")],
                "rate(accepted tokens) / rate(draft tokens), per speculative vLLM server.",
            ),
            (
                "Mean acceptance length",
                "timeseries",
                "short",
                6,
                [q(mean_acceptance_length("route, instance"), "{{route}} {{instance}}")],
                "1 + rate(accepted tokens) / rate(drafts): tokens emitted per target step.",
            ),
            (
                "Acceptance by draft position",
                "timeseries",
                "percentunit",
                6,
                [
                    q(
                        "sum by (route, position) (rate("
                        f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{RI}]))"
                        " / on (route) group_left"
                        f" sum by (route) (rate(vllm:spec_decode_num_drafts_total[{RI}]))",
                        "{{route}} position {{position}}",
                    )
                ],
                "Share of drafts whose token at this position was accepted.",
            ),
            (
                "Draft and accepted tokens/s",
                "timeseries",
                "short",
                6,
                [
                    q(
                        f"sum by (route) (rate(vllm:spec_decode_num_draft_tokens_total[{RI}]))",
                        "proposed {{route}}",
                    ),
                    q(
                        f"sum by (route) (rate(vllm:spec_decode_num_accepted_tokens_total[{RI}]))",
                        "accepted {{route}}",
                    ),
                ],
                "Draft tokens proposed and accepted per second.",
            ),
        ],
    ),
    (
        "Backends (vLLM)",
        [
            (
                "Running requests",
                "timeseries",
                "short",
                6,
                [q("sum by (route) (vllm:num_requests_running)", "{{route}}")],
                "Requests in the engine's running batch.",
            ),
            (
                "Waiting requests",
                "timeseries",
                "short",
                6,
                [q("sum by (route) (vllm:num_requests_waiting)", "{{route}}")],
                "Requests queued in the engine (no KV cache or batch slot).",
            ),
            (
                "KV cache usage",
                "timeseries",
                "percentunit",
                6,
                [q("max by (route) (vllm:kv_cache_usage_perc)", "{{route}}")],
                "Share of the KV cache in use; above routing.guards.spec_max_kv_usage the "
                "gateway stops sending to that speculative route.",
            ),
            (
                "Gateway in-flight",
                "timeseries",
                "short",
                6,
                [q("sum by (route) (specroute_inflight_requests)", "{{route}}")],
                "Requests the gateway is forwarding now, all replicas.",
            ),
            (
                "Generation tokens/s (engine)",
                "timeseries",
                "short",
                8,
                [
                    q(
                        f"sum by (route) (rate(vllm:generation_tokens_total[{RI}]))",
                        "{{route}} generated",
                    ),
                    q(f"sum by (route) (rate(vllm:prompt_tokens_total[{RI}]))", "{{route}} prompt"),
                ],
                "Tokens generated and prompt tokens processed per second by each engine.",
            ),
            (
                "Engine latency p95",
                "timeseries",
                "s",
                8,
                [
                    q(
                        "histogram_quantile(0.95, sum by (route, le) (rate("
                        f"vllm:time_to_first_token_seconds_bucket[{RI}])))",
                        "TTFT {{route}}",
                    ),
                    q(
                        "histogram_quantile(0.95, sum by (route, le) (rate("
                        f"vllm:inter_token_latency_seconds_bucket[{RI}])))",
                        "inter-token {{route}}",
                    ),
                    q(
                        "histogram_quantile(0.95, sum by (route, le) (rate("
                        f"vllm:e2e_request_latency_seconds_bucket[{RI}])))",
                        "e2e {{route}}",
                    ),
                ],
                "The engines' own view (no gateway hop): compare with the gateway's panels.",
            ),
            (
                "Finished requests by reason",
                "timeseries",
                "reqps",
                8,
                [
                    q(
                        f"sum by (route, finished_reason) (rate(vllm:request_success_total[{RI}]))",
                        "{{route}}: {{finished_reason}}",
                    )
                ],
                "stop, length, abort (client disconnects the gateway passed on)...",
            ),
        ],
    ),
    (
        "The router: what it measured, what it believes",
        [
            (
                "Acceptance per workload (per request)",
                "timeseries",
                "percentunit",
                8,
                [
                    q(
                        "sum by (route, workload, source) (rate("
                        f"specroute_spec_acceptance_ratio_sum{{{WL}}}[{RI}])) / sum by "
                        "(route, workload, source) "
                        f"(rate(specroute_spec_acceptance_ratio_count{{{WL}}}[{RI}]))",
                        "{{route}} {{workload}} ({{source}})",
                    )
                ],
                "Mean accepted/proposed draft tokens of the requests speculative routes "
                "answered, by route, workload and source: vLLM's per-request metrics (exact), the "
                "workload's rate attributed from vLLM's counters, or streamed steps.",
            ),
            (
                "Estimated acceptance a (the router's belief)",
                "timeseries",
                "percentunit",
                8,
                [
                    q(
                        f"avg by (route, workload) (specroute_estimated_acceptance_ratio{{{WL}}})",
                        "{{route}} {{workload}}",
                    )
                ],
                "The cost model's per-position acceptance estimate per speculative route and "
                "workload, what it "
                "routes on (a, not accepted/proposed: a=0.8 with k=4 is about 0.59 of drafts).",
            ),
            (
                "Measured / predicted latency (p50)",
                "timeseries",
                "short",
                8,
                [
                    q(
                        "histogram_quantile(0.5, sum by (route, le) "
                        f"(rate(specroute_latency_prediction_ratio_bucket[{RI}])))",
                        "{{route}}",
                    )
                ],
                "1 = the cost model predicted the route's latency exactly; above 1 the route "
                "was slower than predicted.",
            ),
            (
                "Backends as the router sees them",
                "timeseries",
                "short",
                8,
                [
                    q("max by (route) (specroute_backend_running)", "{{route}} running"),
                    q("max by (route) (specroute_backend_waiting)", "{{route}} waiting"),
                ],
                "vLLM's running/waiting as scraped by the gateway (what the router decides "
                "on), next to Prometheus's own scrape in the Backends row.",
            ),
            (
                "KV cache and acceptance (router's scrape)",
                "timeseries",
                "percentunit",
                8,
                [
                    q("max by (route) (specroute_backend_kv_cache_usage_ratio)", "{{route}} KV"),
                    q(
                        "max by (route) (specroute_backend_spec_acceptance_ratio)",
                        "{{route}} acceptance",
                    ),
                ],
                "KV-cache usage and acceptance from the counter deltas the gateway scrapes.",
            ),
            (
                "Acceptance attributed from vLLM's counters",
                "timeseries",
                "percentunit",
                8,
                [
                    q(
                        f"avg by (route, workload) (specroute_attributed_acceptance_ratio{{{WL}}})",
                        "{{route}} {{workload}}",
                    )
                ],
                "Accepted/drafted tokens per speculative route and workload, from vLLM's "
                "spec_decode counter deltas "
                "shared among the requests decoding in each scrape window. What answers "
                "without per-request metrics learn from; empty until enough drafted tokens.",
            ),
            (
                "Counter windows by outcome",
                "timeseries",
                "short",
                8,
                [
                    q(
                        f"sum by (outcome) (rate(specroute_attribution_windows_total[{RI}]))",
                        "{{outcome}}",
                    )
                ],
                "Scrape windows of the speculative counters per second: attributed, or why "
                "not (reset: a vLLM restart; stale: a failed scrape; foreign: other clients).",
            ),
            (
                "Acceptance source in use",
                "timeseries",
                "short",
                8,
                [q("max by (source) (specroute_acceptance_source) == 1", "{{source}}")],
                "Where speculative answers' acceptance comes from: per_request_metrics "
                "(--per-request-spec-decode-metrics), counter_attribution, stream_steps, or "
                "unknown before the first speculative answer.",
            ),
            (
                "Failovers",
                "timeseries",
                "reqps",
                8,
                [
                    q(
                        f"sum by (from_route, to_route) (rate(specroute_failovers_total[{RI}]))",
                        "{{from_route}} -> {{to_route}}",
                    )
                ],
                "Requests answered by the other backend than the one chosen (refused, 5xx "
                "before the first byte, or admission limit).",
            ),
        ],
    ),
    (
        "Live side-by-side (shadow copies)",
        [
            (
                "Live speedup per workload (shadow pairs)",
                "timeseries",
                "short",
                8,
                [q(shadow_ratio("baseline", "speculative"), "{{workload}}")],
                "The same request on two routes: a user's and its shadow copy on another "
                "route, in idle GPU time, same answer length. Over the pairs where one route "
                "speculates and the other does not: e2e without / e2e with speculation, summed "
                "over the last 30 min of pairs where the user request ran alone; above 1 "
                "speculation pays. Gaps: no idle time, hence no pairs.",
            ),
            (
                "Live regret of the router (shadow pairs)",
                "timeseries",
                "short",
                8,
                [q(shadow_ratio("chosen", "faster"), "{{workload}}")],
                "The chosen route's e2e / the faster of the pair's, over the last 30 min of "
                "pairs: 1 when every choice was the faster route.",
            ),
            (
                "Shadow copies by outcome",
                "timeseries",
                "short",
                8,
                [
                    q(
                        f"sum by (outcome) (rate(specroute_shadow_requests_total{{{WL}}}[{RI}]))",
                        "{{outcome}}",
                    )
                ],
                "Copies per second: completed, cancelled (a user request needed the GPU, a "
                "backend left rotation), skipped (no idle time in time, a backend unhealthy), "
                "failed. GPU cost: each completed copy is one extra generation in idle time.",
            ),
        ],
    ),
    (
        "Errors",
        [
            (
                "Requests by status",
                "timeseries",
                "reqps",
                8,
                [
                    q(
                        'sum by (route, status) (rate(specroute_requests_total{status!="2xx"}'
                        f"[{RI}]))",
                        "{{route}} {{status}}",
                    )
                ],
                "Everything that was not a 2xx, by route and status class.",
            ),
            (
                "Upstream errors",
                "timeseries",
                "short",
                8,
                [
                    q(
                        f"sum by (route, kind) (rate(specroute_upstream_errors_total[{RI}]))",
                        "{{route}} {{kind}}",
                    )
                ],
                "Failures talking to a backend per second, by kind.",
            ),
            (
                "Scrape targets up",
                "timeseries",
                "short",
                8,
                [q('up{job=~"specroute-gateway|vllm"}', "{{job}} {{instance}}")],
                "Prometheus's own view of the gateway replicas and vLLM servers.",
            ),
            (
                "Servers in rotation",
                "timeseries",
                "short",
                12,
                [q("min by (route, url) (specroute_endpoint_up)", "{{route}} {{url}}")],
                "1 while every gateway replica sends requests to the server at url: its "
                "/health answers and it is not ejected. 0: down, refusing, or ejected.",
            ),
            (
                "Ejections",
                "timeseries",
                "short",
                12,
                [
                    q(
                        f"sum by (route, url) (increase(specroute_endpoint_ejections_total[{RI}]))",
                        "{{route}} {{url}}",
                    )
                ],
                "Servers taken out of rotation for failing requests in a row, all replicas.",
            ),
        ],
    ),
    (
        "Latency targets",
        [
            (
                GOODPUT,
                "timeseries",
                "percentunit",
                12,
                [q(goodput("route, target"), "{{route}} {{target}}")],
                "Of the streamed answers with a latency target (llm-d's x-llm-d-slo-ttft-ms /"
                " x-llm-d-slo-tpot-ms, or [latency_targets.MODEL]), the share that met it, by"
                " route and target. Whole (non-streamed) answers are unmeasured: left out.",
            ),
            (
                "Latency targets by outcome",
                "timeseries",
                "reqps",
                12,
                [
                    q(
                        "sum by (workload, target, outcome) (rate(specroute_slo_requests_total"
                        f"{{{WL}}}[{RI}]))",
                        "{{workload}} {{target}} {{outcome}}",
                    )
                ],
                "Answers with a latency target per second: met, missed, or unmeasured (a"
                " whole answer: the gateway sees no first token), by workload and target.",
            ),
        ],
    ),
]


def panel(pid: int, x: int, y: int, spec: Panel) -> dict[str, Any]:
    title, kind, unit, width, targets, description = spec
    height = 4 if kind == "stat" else 8
    out: dict[str, Any] = {
        "id": pid,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"h": height, "w": width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"datasource": DS, "refId": chr(ord("A") + i), "range": True, **t}
            for i, t in enumerate(targets)
        ],
    }
    if kind == "stat":
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value"}
    else:
        out["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    return out


def build() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid = 1
    y = 0
    for row_title, specs in ROWS:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid += 1
        y += 1
        x = 0
        row_height = 0
        for spec in specs:
            p = panel(pid, x, y, spec)
            if x + p["gridPos"]["w"] > 24:
                y += row_height
                x = 0
                row_height = 0
                p["gridPos"].update(x=x, y=y)
            panels.append(p)
            pid += 1
            x += p["gridPos"]["w"]
            row_height = max(row_height, p["gridPos"]["h"])
        y += row_height
    return {
        "uid": UID,
        "title": "specroute: routing among speculation configurations",
        "description": "Gateway routes, latency per route and workload, vLLM speculative "
        "decoding acceptance, backend load and errors.",
        "tags": ["specroute", "vllm", "speculative-decoding"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                {
                    "name": "workload",
                    "label": "Workload",
                    "type": "query",
                    "datasource": DS,
                    "query": {
                        "query": "label_values(specroute_requests_total, workload)",
                        "refId": "workload",
                    },
                    "definition": "label_values(specroute_requests_total, workload)",
                    "refresh": 2,
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "current": {"text": "All", "value": "$__all"},
                    "sort": 1,
                    "hide": 0,
                },
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
