"""Feed each finished request back to a learning policy, and show what it believes.

Only complete, successful answers teach the model (a cancelled request's
duration says nothing about the route). The estimates it holds are exported
as gauges so an SRE can see what the router believes next to what it measured.
"""

from __future__ import annotations

from classifier.costmodel import CostModelPolicy, Observation, send_batch
from classifier.features import RequestFeatures
from classifier.policy import Decision, LiveState, Policy
from gateway.measure import MeasuredAcceptance
from gateway.proxy import Exchange
from gateway.telemetry import Metrics


def learn(
    policy: Policy,
    metrics: Metrics,
    features: RequestFeatures | None,
    decision: Decision | None,
    state: LiveState | None,
    exchange: Exchange,
    acceptance: MeasuredAcceptance | None,
) -> None:
    route = exchange.route
    if features is None or decision is None or state is None or route is None:
        return
    if exchange.error_kind is not None or exchange.status != 200:
        return
    predicted = decision.predicted_s.get(route) if decision.predicted_s else None
    if predicted:
        metrics.prediction_ratio.labels(route.value).observe(exchange.duration_s / predicted)
    if not isinstance(policy, CostModelPolicy):
        return
    usage = exchange.usage or {}
    completion = usage.get("completion_tokens")
    if not isinstance(completion, int) or completion <= 0:
        return
    prompt = usage.get("prompt_tokens")
    policy.observe(
        Observation(
            route=route,
            features=features,
            batch=send_batch(state, route, features.n),
            other_batch=state.of(route.other).inflight,
            prefill_ahead=state.of(route).prefill_tokens,
            waiting=exchange.waiting,
            ttft_s=exchange.ttft_s,
            duration_s=exchange.duration_s,
            prompt_tokens=prompt if isinstance(prompt, int) else features.prompt_tokens,
            completion_tokens=completion,
            acceptance=acceptance.rate if acceptance else None,
            predicted_s=predicted,
        )
    )
    for workload, a in policy.estimated_acceptance().items():
        metrics.estimated_acceptance.labels(workload.value).set(a)


def predicted_header(decision: Decision) -> str | None:
    """`speculative=0.812;baseline=1.034`: both predicted latencies, in seconds."""
    if not decision.predicted_s:
        return None
    return ";".join(f"{r.value}={s:.3f}" for r, s in decision.predicted_s.items())
