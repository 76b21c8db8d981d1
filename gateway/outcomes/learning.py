"""Feed each finished request back to the policy, and show what it believes.

Only complete, successful answers teach (a cancelled request's duration says
nothing about the route): `RequestRecord.lesson` is None for the rest. The
estimates the policy holds are exported as gauges so an SRE can see what the
router believes next to what it measured.
"""

from __future__ import annotations

from classifier.types import Decision, Policy
from gateway.telemetry import Metrics
from gateway.wire.life import Lesson, RequestRecord


def learn(policy: Policy, metrics: Metrics, record: RequestRecord) -> None:
    lesson = record.lesson
    if record.failover_from is not None and record.features is not None:
        policy.learn_failure(record.failover_from, record.features)  # failed before a byte
    if lesson is None:
        if _route_failed(record):
            assert record.route is not None and record.features is not None
            policy.learn_failure(record.route, record.features)
        return
    if lesson.predicted_s:
        ratio = lesson.duration_s / lesson.predicted_s
        metrics.prediction_ratio.labels(lesson.route.value).observe(ratio)
    policy.learn(lesson)
    _show_beliefs(policy, metrics)
    shared = policy.shared_gpu(lesson.pair)
    gauge = metrics.gpu_shared.labels(str(lesson.pair))
    gauge.set(float("nan") if shared is None else float(shared))


def learn_shadow(policy: Policy, metrics: Metrics, lesson: Lesson) -> None:
    """A shadow copy's answer (gateway/shadow/runner.py): a measurement at no user's
    expense, for the policy that learns from one."""
    policy.learn_shadow(lesson)
    _show_beliefs(policy, metrics)


def _route_failed(record: RequestRecord) -> bool:
    """The answering route failed it: a 5xx or a stream that broke, not the client's
    doing (a disconnect, a 4xx for its own bad input)."""
    if record.route is None or record.features is None:
        return False
    return record.status in ("5xx", "stream_error")


def _show_beliefs(policy: Policy, metrics: Metrics) -> None:
    for route, believed in policy.estimated_acceptance().items():
        for workload, a in believed.items():
            metrics.estimated_acceptance.labels(route.value, workload.value).set(a)


def predicted_header(decision: Decision) -> str | None:
    """`speculative=0.812;baseline=1.034`: every route's predicted latency, in seconds."""
    if not decision.predicted_s:
        return None
    return ";".join(f"{r.value}={s:.3f}" for r, s in decision.predicted_s.items())
