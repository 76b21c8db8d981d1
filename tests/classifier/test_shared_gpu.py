"""Two servers on one GPU: a busy neighbour's steps are part of each route's time."""

from __future__ import annotations

import pytest

from classifier.latency import LatencyModel, LatencyPriors, RouteLoad
from classifier.policy import Route

SPEC, BASE = Route.SPECULATIVE, Route.BASELINE


def test_a_busy_neighbour_adds_its_steps_and_is_taken_out_when_learning() -> None:
    priors = LatencyPriors()
    model = LatencyModel(priors, num_speculative_tokens=4, draft_cost_ratio=0.2)
    alone = model.predict(BASE, RouteLoad(100, 101, 1))
    shared = model.predict(BASE, RouteLoad(100, 101, 1, other_batch=4))
    spec_step = (priors.step_base_s + 4 * priors.step_per_seq_s) * 1.8  # the spec prior's step
    assert shared - alone == pytest.approx(100 * spec_step)
    # An answer that took exactly its own cost plus the neighbour's steps teaches
    # nothing new about its own rates.
    before = model.parameters()[BASE]
    for _ in range(50):
        model.observe(BASE, RouteLoad(100, 101, 1, other_batch=4), duration_s=shared, ttft_s=None)
    after = model.parameters()[BASE]
    assert after.step_base_s == pytest.approx(before.step_base_s, rel=0.05)


def test_waking_an_idle_server_costs_the_busy_one_whole_steps() -> None:
    model = LatencyModel(LatencyPriors(), num_speculative_tokens=4, draft_cost_ratio=0.2)
    priors = LatencyPriors()
    # Baseline idle, 8 requests on the speculative server: each of this request's
    # 100 baseline steps makes those 8 wait a whole baseline step.
    woken = model.slowdown_of_others(BASE, RouteLoad(0, 101, 1, other_batch=8))
    assert woken == pytest.approx(100 * 8 * (priors.step_base_s + priors.step_per_seq_s))
    # Joining a busy baseline instead only adds one sequence's share to each step.
    joined = model.slowdown_of_others(BASE, RouteLoad(0, 101, 3, other_batch=8))
    assert joined == pytest.approx(100 * (2 + 8) * priors.step_per_seq_s)
    assert model.slowdown_of_others(BASE, RouteLoad(0, 101, 1, other_batch=0)) == 0.0
