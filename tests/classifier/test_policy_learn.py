"""Policy.learn: every policy takes a FinishedRequest; the cost model turns it into
the Observation its models learn from, at the load its decision saw."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from costmodel_sim import features

from classifier.costmodel import CostModelConfig, CostModelPolicy, Observation
from classifier.features import Workload
from classifier.policy import (
    BackendState,
    FinishedRequest,
    LiveState,
    Policy,
    Route,
    RulesConfig,
    RulesPolicy,
    StaticPolicy,
)
from gateway.record import Lesson

SPEC, BASE = Route.SPECULATIVE, Route.BASELINE
CHAT = features(Workload.CHAT, 300, 256, 0.7)
# Three on the speculative server (one streaming a 900-token prompt), two on the baseline.
BUSY = LiveState(
    BackendState(inflight=3, waiting=1, prefill_tokens=900),
    BackendState(inflight=2, running=4, waiting=2),
)


def finished(route: Route, **overrides: Any) -> FinishedRequest:
    """The gateway's own value for a finished request (what it hands to learn())."""
    base = Lesson(route, CHAT, BUSY, 0.08, 2.5, 320, 200, 0.6, 2.0)
    return dataclasses.replace(base, **overrides)


def beliefs(p: CostModelPolicy) -> tuple[object, ...]:
    return (
        p.latency_parameters(),
        p.estimated_acceptance(),
        p.acceptance_samples(),
        p.prediction_error(),
        p.predict(CHAT, BUSY),
    )


@pytest.mark.parametrize("route", [SPEC, BASE])
def test_learn_is_observe_at_the_decisions_load(route: Route) -> None:
    learned, observed = CostModelPolicy(CostModelConfig()), CostModelPolicy(CostModelConfig())
    learned.learn(finished(route))
    observed.observe(
        Observation(
            route=route,
            features=CHAT,
            batch=BUSY.of(route).load + 1,  # the batch it joined, itself included
            waiting=BUSY.of(route).waiting,
            ttft_s=0.08,
            duration_s=2.5,
            prompt_tokens=320,
            completion_tokens=200,
            acceptance=0.6,
            predicted_s=2.0,
            other_batch=BUSY.of(route.other).inflight,
            prefill_ahead=BUSY.of(route).prefill_tokens,
        )
    )
    assert beliefs(learned) == beliefs(observed)
    assert beliefs(learned) != beliefs(CostModelPolicy(CostModelConfig()))


def test_learn_skips_an_answer_without_tokens() -> None:
    p = CostModelPolicy(CostModelConfig())
    p.learn(finished(SPEC, completion_tokens=0))
    assert beliefs(p) == beliefs(CostModelPolicy(CostModelConfig()))


def test_without_the_backends_count_the_gateways_is_used() -> None:
    """prompt_tokens is for logs only; a missing one changes nothing the model learns."""
    with_usage, without = CostModelPolicy(CostModelConfig()), CostModelPolicy(CostModelConfig())
    with_usage.learn(finished(SPEC))
    without.learn(finished(SPEC, prompt_tokens=None))
    assert beliefs(with_usage) == beliefs(without)


def test_every_policy_learns_and_reports_its_estimate() -> None:
    policies: list[Policy] = [
        RulesPolicy(RulesConfig()),
        StaticPolicy(SPEC),
        CostModelPolicy(CostModelConfig()),
    ]
    for p in policies:
        p.learn(finished(SPEC))
    assert [dict(p.estimated_acceptance()) == {} for p in policies] == [True, True, False]
    assert set(policies[2].estimated_acceptance()) == set(Workload)
