"""A dynamic-speculation route (vLLM's num_speculative_tokens_per_batch_size): the router
prices each request at the K the batch it joins gives, with the drafter's per-position
acceptance at that K (classifier/cost.py, classifier/router.py)."""

from __future__ import annotations

import math

import pytest

from classifier.cost import prior_profile
from classifier.features import Workload
from classifier.router import ProfiledPolicy, RouterConfig
from classifier.speculation import acceptance_rate, expected_tokens_per_step, k_at
from classifier.types import BackendState, LiveState, Route, RouteSpec
from gateway.wire.life import Lesson
from tests.classifier.test_router import feats, profile

SPEC, BASE = Route.SPECULATIVE, Route.BASELINE
# Full k = 4 up to a batch of 2, K = 2 to 8, no drafts past 8.
SCHEDULE = ((1, 2, 4), (3, 8, 2), (9, 256, 0))


def _policy(schedule: tuple[tuple[int, int, int], ...] = SCHEDULE) -> ProfiledPolicy:
    routes = (RouteSpec(SPEC, 4, "ngram", 0.2, k_by_batch=schedule), RouteSpec(BASE))
    return ProfiledPolicy(
        RouterConfig(), routes=routes, profile=profile(probes={Workload.CODE: 3.0})
    )


def _loaded(spec: int, base: int = 0) -> LiveState:
    return LiveState.pair(BackendState(inflight=spec), BackendState(inflight=base))


def test_k_at_is_vllms_lookup() -> None:
    """The range's K, a gap's the range's before it, past the last the last one's, at most
    k; an empty schedule is static k."""
    gappy = ((1, 2, 4), (5, 8, 1))
    assert [k_at(gappy, b, 3) for b in (0, 1, 2, 3, 4, 5, 9, 1000)] == [3, 3, 3, 3, 3, 1, 1, 1]
    assert k_at((), 50, 4) == 4


def test_tokens_per_step_fall_with_the_load_as_the_schedule_says() -> None:
    """Joining a batch of 1, 3 and 9: K = 4, 2, 0; tokens per step 1 + a + .. + a^K at the
    drafter's a, and 1 at K = 0, as without speculation."""
    policy = _policy()
    f = feats(Workload.CODE)
    seen = []
    for load, k in ((0, 4), (2, 2), (8, 0)):
        d = policy.decide(f, _loaded(load))
        assert d.why is not None
        a = d.why["alpha"]["speculative"]  # type: ignore[index]
        tokens = d.why["tokens_per_step"]["speculative"]  # type: ignore[index]
        assert d.why["k"] == {"speculative": k}
        assert tokens == pytest.approx(expected_tokens_per_step(a, k), abs=1e-3)
        seen.append(tokens)
    assert seen[0] > seen[1] > seen[2] == 1.0
    # At full K it is priced as the static route of that k, to the bit.
    static = ProfiledPolicy(
        RouterConfig(), routes=(RouteSpec(SPEC, 4, "ngram", 0.2), RouteSpec(BASE))
    )
    static.use_profile(profile(probes={Workload.CODE: 3.0}))
    for load in (0, 1):
        assert policy.predict(f, _loaded(load)) == static.predict(f, _loaded(load))
        dynamic, fixed = policy.decide(f, _loaded(load)), static.decide(f, _loaded(load))
        assert dynamic.route == fixed.route and dynamic.predicted_s == fixed.predicted_s
        assert dynamic.why is not None and fixed.why is not None and "k" not in fixed.why
        assert {key: v for key, v in dynamic.why.items() if key != "k"} == fixed.why


def test_the_followers_carry_at_the_k_of_the_carried_batch() -> None:
    """A dynamic server carrying a big batch drafts nothing: its followers' time there is
    the profile's step at 1 token a step; the static server of the same profile would
    speculate and look cheaper to carry."""
    f = feats(Workload.CODE)
    busy = _loaded(12, 1)
    dynamic = _policy().decide(f, busy)
    static = _policy(()).decide(f, busy)
    assert dynamic.why is not None and static.why is not None
    follows_dyn = dynamic.why.get("followers_s", {})
    follows_static = static.why.get("followers_s", {})
    assert follows_dyn[SPEC.value] > follows_static[SPEC.value]  # type: ignore[index]


def test_the_prior_steps_at_the_k_of_each_batch() -> None:
    """Unprofiled, a speculative step costs (1 + K*c) plain steps at the K its batch gives."""
    dyn = prior_profile(
        (RouteSpec(SPEC, 4, "draft_model", 0.2, k_by_batch=SCHEDULE), RouteSpec(BASE))
    )
    static = prior_profile((RouteSpec(SPEC, 4, "draft_model", 0.2), RouteSpec(BASE)))
    base = dyn.route("baseline")
    d, s = dyn.route("speculative"), static.route("speculative")
    assert base is not None and d is not None and s is not None
    for b, k in ((1.0, 4), (2.0, 4), (4.0, 2), (8.0, 2), (16.0, 0), (32.0, 0)):
        assert d.step.at(b) == pytest.approx(base.step.at(b) * (1 + 0.2 * k))
    assert d.step.at(1.0) == s.step.at(1.0) and d.step.at(32.0) < s.step.at(32.0)


def test_an_answer_teaches_the_drafters_a_at_the_k_it_ran() -> None:
    """An answer at a batch of 3 ran K = 2: its rate per step over the most k (what the
    gateway measures) is read at K = 2, so the drafter's a comes out true. At K = 0 it
    drafted nothing and teaches no acceptance."""
    f = feats(Workload.CODE, out=256)
    truth = 0.5
    per_step = (expected_tokens_per_step(truth, 2) - 1.0) / 4  # accepted per step / k
    policy = _policy()
    for _ in range(300):
        policy.learn(Lesson(SPEC, f, _loaded(2), 0.02, 1.0, 100, 256, per_step, None))
    learned = policy.estimated_acceptance()[SPEC][Workload.CODE]
    assert learned == pytest.approx(truth, abs=0.02)
    # Read at its most k instead, the same answers would say a far lower a.
    assert acceptance_rate(truth, 4) > per_step
    before = policy.estimated_acceptance()[SPEC][Workload.CODE]
    for _ in range(50):
        policy.learn(Lesson(SPEC, f, _loaded(20), 0.02, 1.0, 100, 256, 0.0, None))
    assert policy.estimated_acceptance()[SPEC][Workload.CODE] == before


def test_a_dynamic_routes_cost_counts_a_k_of_zero_as_no_speculation() -> None:
    """At K = 0 the speculative route's decode is priced at one token a step: at a load
    past the schedule's last K its decode steps are the output's, less the first."""
    policy = _policy()
    f = feats(Workload.CODE, out=129)
    d = policy.decide(f, _loaded(10))
    assert d.why is not None and d.why["tokens_per_step"] == {"speculative": 1.0}
    assert math.isfinite(d.why["cost_s"]["speculative"])  # type: ignore[index]
