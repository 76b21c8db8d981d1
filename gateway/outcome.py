"""What one request did, written once: metrics and the canonical log line."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import structlog

from classifier.features import RequestFeatures
from classifier.policy import Decision, Route
from gateway.measure import MeasuredAcceptance, from_report, from_stream_steps
from gateway.proxy import Exchange
from gateway.telemetry import Metrics

log = structlog.get_logger("specroute.request")


def status_label(exchange: Exchange) -> str:
    if exchange.error_kind == "client_disconnect":
        return "client_disconnect"
    if exchange.error_kind in ("upstream_broken", "upstream_stall") and exchange.status == 200:
        return "stream_error"
    if exchange.status == 0:
        return "5xx"  # died before any status: counted as ours
    return f"{exchange.status // 100}xx"


def record_outcome(
    metrics: Metrics,
    features: RequestFeatures | None,
    decision: Decision | None,
    exchange: Exchange,
    *,
    num_speculative_tokens: int,
) -> MeasuredAcceptance | None:
    """Runs in the handler's `finally`: also for cancelled and failed requests."""
    answered = exchange.route or (decision.route if decision else None)
    route = answered.value if answered else "none"
    workload = features.workload.value if features else "none"
    status = status_label(exchange)
    duration = exchange.duration_s
    usage = exchange.usage or {}
    completion_tokens = usage.get("completion_tokens")
    prompt_tokens = usage.get("prompt_tokens")

    metrics.requests.labels(route, workload, status).inc()
    if decision is not None:
        metrics.decisions.labels(decision.route.value, decision.reason).inc()
    if exchange.failover_from is not None:
        metrics.failovers.labels(exchange.failover_from.value, route).inc()
    tpot = None
    acceptance = None
    if status == "2xx" and answered is Route.SPECULATIVE:
        acceptance = measure_acceptance(
            exchange, features, completion_tokens, num_speculative_tokens
        )
        if acceptance is not None:
            metrics.acceptance.labels(workload, acceptance.source).observe(acceptance.rate)
    if status == "2xx":
        metrics.duration.labels(route, workload).observe(duration)
        if isinstance(completion_tokens, int):
            metrics.output_tokens.labels(route, workload).inc(completion_tokens)
        if exchange.ttft_s is not None:
            metrics.ttft.labels(route, workload).observe(exchange.ttft_s)
            if isinstance(completion_tokens, int) and completion_tokens > 1:
                tpot = (duration - exchange.ttft_s) / (completion_tokens - 1)
                metrics.tpot.labels(route, workload).observe(tpot)

    log.info(
        "request",
        route=route,
        reason=decision.reason if decision else None,
        failover_from=exchange.failover_from.value if exchange.failover_from else None,
        workload=workload,
        status=status,
        http_status=exchange.status,
        error=exchange.error_kind,
        stream=features.stream if features else None,
        prompt_tokens=prompt_tokens,
        prompt_tokens_estimate=features.prompt_tokens if features else None,
        completion_tokens=completion_tokens,
        acceptance=_round(acceptance.rate) if acceptance else None,
        acceptance_length=_round(acceptance.mean_length) if acceptance else None,
        acceptance_source=acceptance.source if acceptance else None,
        ttft_s=_round(exchange.ttft_s),
        tpot_s=_round(tpot),
        duration_s=_round(duration),
    )
    return acceptance


def measure_acceptance(
    exchange: Exchange,
    features: RequestFeatures | None,
    completion_tokens: object,
    num_speculative_tokens: int,
) -> MeasuredAcceptance | None:
    measured = from_report(exchange.report)
    if measured is None and features is not None and features.stream and features.n == 1:
        tokens = completion_tokens if isinstance(completion_tokens, int) else None
        measured = from_stream_steps(tokens, exchange.token_events, num_speculative_tokens)
    return measured


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def outcome_record(
    request_id: str,
    features: RequestFeatures | None,
    decision: Decision,
    exchange: Exchange,
    acceptance: MeasuredAcceptance | None,
    prompt: Any = None,
) -> dict[str, Any]:
    """One line of the outcome log: everything `train` and `advise` learn from."""
    usage = exchange.usage or {}
    record: dict[str, Any] = {
        "ts": round(time.time(), 3),
        "request_id": request_id,
        "route": (exchange.route or decision.route).value,
        "decided_route": decision.route.value,
        "reason": decision.reason,
        "failover_from": exchange.failover_from.value if exchange.failover_from else None,
        "predicted_s": (
            {r.value: round(s, 6) for r, s in decision.predicted_s.items()}
            if decision.predicted_s
            else None
        ),
        "features": dataclasses.asdict(features) if features else None,
        "status": status_label(exchange),
        "http_status": exchange.status,
        "error": exchange.error_kind,
        "batch": exchange.batch,
        "waiting": exchange.waiting,
        "ttft_s": _round(exchange.ttft_s),
        "duration_s": _round(exchange.duration_s),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "token_events": exchange.token_events if features and features.stream else None,
        "acceptance": _round(acceptance.rate) if acceptance else None,
        "acceptance_length": _round(acceptance.mean_length) if acceptance else None,
        "acceptance_source": acceptance.source if acceptance else None,
    }
    if prompt is not None:
        record["prompt"] = prompt
    return record
