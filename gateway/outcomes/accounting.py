"""What one finished request leaves behind: its metrics and its canonical log line."""

from __future__ import annotations

import structlog

from gateway.telemetry import Metrics
from gateway.wire.life import RequestRecord

log = structlog.get_logger("specroute.request")

# The route label of a request refused before any route took it (bad input, over a
# limit): "_" starts no route's name (classifier/types.py ROUTE_NAME), so it never
# merges with a route's own figures (a route is often named "none").
NO_ROUTE = "_none"


def count_request(metrics: Metrics, record: RequestRecord) -> None:
    """Prometheus, for every request that reached the handler (cancelled and failed too)."""
    route = record.route.value if record.route else NO_ROUTE
    workload = record.features.workload.value if record.features else "none"
    metrics.requests.labels(route, workload, record.status).inc()
    if record.decision is not None:
        metrics.decisions.labels(record.decision.route.value, record.decision.reason).inc()
    if record.failover_from is not None:
        metrics.failovers.labels(record.failover_from.value, route).inc()
    if record.acceptance is not None:
        metrics.acceptance.labels(route, workload, record.acceptance.source).observe(
            record.acceptance.per_step
        )
    if record.status != "2xx":
        return
    metrics.duration.labels(route, workload).observe(record.duration_s)
    if record.completion_tokens is not None:
        metrics.output_tokens.labels(route, workload).inc(record.completion_tokens)
    if record.ttft_s is not None:
        metrics.ttft.labels(route, workload).observe(record.ttft_s)
    if (tpot := record.tpot_s) is not None:
        metrics.tpot.labels(route, workload).observe(tpot)
    for target, outcome in (record.slo or {}).items():
        metrics.slo.labels(route, workload, target, outcome).inc()


def log_request(record: RequestRecord) -> None:
    """The one log line per request: what it was, where it went, what it took."""
    acceptance = record.acceptance
    log.info(
        "request",
        route=record.route.value if record.route else NO_ROUTE,
        reason=record.decision.reason if record.decision else None,
        failover_from=record.failover_from.value if record.failover_from else None,
        workload=record.features.workload.value if record.features else "none",
        pair=record.pair,
        status=record.status,
        http_status=record.http_status,
        error=record.error,
        stream=record.features.stream if record.features else None,
        prompt_tokens=record.prompt_tokens,
        prompt_tokens_estimate=record.features.prompt_tokens if record.features else None,
        completion_tokens=record.completion_tokens,
        acceptance=rounded(acceptance.rate) if acceptance else None,
        acceptance_length=rounded(acceptance.mean_length) if acceptance else None,
        acceptance_source=acceptance.source if acceptance else None,
        acceptance_per_step=rounded(acceptance.per_step) if acceptance else None,
        ttft_s=rounded(record.ttft_s),
        tpot_s=rounded(record.tpot_s),
        duration_s=rounded(record.duration_s),
        slo=record.slo,
        why=dict(record.decision.why) if record.decision and record.decision.why else None,
    )


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
