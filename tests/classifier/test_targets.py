"""classifier/targets.py: latency targets and the pick they make among routes."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from classifier.cost import Prediction, prior_profile
from classifier.features import Endpoint, RequestFeatures, Workload
from classifier.router import ProfiledPolicy, RouterConfig
from classifier.targets import LatencyTargets, pick, predicted_tpot_s
from classifier.types import BackendState, LiveState, Route, two_routes


def _p(first_token_s: float, tpot_s: float, tokens: int = 101, cost_s: float = 0.0) -> Prediction:
    """A prediction of `tokens` tokens, one per step: the first at first_token_s, then
    one every tpot_s; its cost `cost_s` (else its e2e)."""
    steps = float(tokens - 1)
    e2e = first_token_s + steps * tpot_s
    return Prediction(e2e, cost_s or e2e, 1.0, steps, first_token_s)


def test_predicted_tpot_is_the_decode_time_over_the_tokens_after_the_first() -> None:
    # 200 tokens at 2.5 per step: 79.6 steps for the 199 after the first.
    p = Prediction(e2e_s=1.1, cost_s=1.3, tokens_per_step=2.5, decode_steps=199 / 2.5,
                   first_token_s=0.1)  # fmt: skip
    assert predicted_tpot_s(p) == pytest.approx(1.0 / 199)
    # One token: nothing after the first, no division by zero.
    assert predicted_tpot_s(Prediction(0.1, 0.1, 1.0, 0.0, 0.1)) == 0.0


def test_without_targets_every_route_is_allowed_and_the_cheapest_taken() -> None:
    predicted = {"a": _p(0.5, 0.02), "b": _p(0.1, 0.01)}
    cost = {"a": 1.0, "b": 2.0}
    for targets in (None, LatencyTargets()):
        chosen = pick(["a", "b"], predicted, cost, targets)
        assert (chosen.route, chosen.allowed, chosen.met) == ("a", ("a", "b"), True)


def test_the_cheapest_of_the_routes_predicted_to_meet_the_target() -> None:
    predicted = {"a": _p(0.5, 0.02), "b": _p(0.15, 0.03), "c": _p(0.1, 0.01)}
    cost = {"a": 1.0, "b": 2.0, "c": 3.0}
    chosen = pick(["a", "b", "c"], predicted, cost, LatencyTargets(ttft_s=0.2))
    assert (chosen.route, chosen.allowed, chosen.met) == ("b", ("b", "c"), True)
    both = pick(["a", "b", "c"], predicted, cost, LatencyTargets(ttft_s=0.2, tpot_s=0.02))
    assert (both.route, both.allowed, both.met) == ("c", ("c",), True)
    # A target met exactly is met.
    exact = pick(["a", "b"], predicted, cost, LatencyTargets(ttft_s=0.5))
    assert (exact.route, exact.met) == ("a", True)


def test_none_meets_it_the_closest_by_its_worst_ratio_and_says_so() -> None:
    predicted = {"a": _p(0.4, 0.01), "b": _p(0.3, 0.05), "c": _p(0.35, 0.02)}
    cost = {"a": 1.0, "b": 2.0, "c": 3.0}
    # ttft 0.2 and tpot 0.02: a is 2.0x and 0.5x, b 1.5x and 2.5x, c 1.75x and 1x.
    chosen = pick(["a", "b", "c"], predicted, cost, LatencyTargets(ttft_s=0.2, tpot_s=0.02))
    assert (chosen.route, chosen.allowed, chosen.met) == ("c", ("c",), False)
    # Equally far: the cheaper.
    twins = {"a": _p(0.4, 0.01), "b": _p(0.4, 0.01)}
    chosen = pick(["b", "a"], twins, {"a": 1.0, "b": 2.0}, LatencyTargets(ttft_s=0.2))
    assert (chosen.route, chosen.met) == ("a", False)


def test_a_target_moves_a_request_only_within_the_regret_bound() -> None:
    predicted = {"a": _p(0.5, 0.02), "b": _p(0.1, 0.01), "c": _p(0.15, 0.01)}
    cost = {"a": 1.0, "b": 1.3, "c": 1.2}
    targets = LatencyTargets(ttft_s=0.2)
    assert pick(["a", "b", "c"], predicted, cost, targets).route == "c"
    # Within 25% of the cheapest: c (1.2), not b (1.3).
    chosen = pick(["a", "b", "c"], predicted, cost, targets, max_regret=0.25)
    assert (chosen.route, chosen.allowed, chosen.met) == ("c", ("c",), True)
    # Within 10%: only a, which misses; the closest of those near enough is a.
    chosen = pick(["a", "b", "c"], predicted, cost, targets, max_regret=0.1)
    assert (chosen.route, chosen.allowed, chosen.met) == ("a", ("a",), False)
    # No target: the bound changes nothing.
    assert pick(["a", "b"], predicted, cost, None, max_regret=0.0).allowed == ("a", "b")


def test_targets_are_finite_and_positive() -> None:
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="finite number > 0"):
            LatencyTargets(ttft_s=bad)
        with pytest.raises(ValueError, match="finite number > 0"):
            LatencyTargets(tpot_s=bad)
    assert LatencyTargets(0.2, 0.05).as_dict() == {"ttft_ms": 200.0, "tpot_ms": 50.0}
    assert LatencyTargets(tpot_s=0.05).as_dict() == {"tpot_ms": 50.0}


def test_no_route_to_pick_from_is_an_error() -> None:
    with pytest.raises(ValueError, match="no route"):
        pick([], {}, {}, LatencyTargets(ttft_s=0.2))


times = st.floats(min_value=0.001, max_value=10.0)


@given(
    routes=st.lists(st.tuples(times, times, times), min_size=1, max_size=5),
    ttft=st.none() | times,
    tpot=st.none() | st.floats(min_value=0.0001, max_value=0.5),
    regret=st.sampled_from([math.inf, 0.25, 0.0]),
)
def test_the_pick_is_met_and_cheapest_or_closest(
    routes: list[tuple[float, float, float]],
    ttft: float | None,
    tpot: float | None,
    regret: float,
) -> None:
    names = [f"r{i}" for i in range(len(routes))]
    predicted = {n: _p(f, t) for n, (f, t, _) in zip(names, routes, strict=True)}
    cost = {n: c for n, (_, _, c) in zip(names, routes, strict=True)}
    targets = LatencyTargets(ttft, tpot)
    chosen = pick(names, predicted, cost, targets, regret)
    if targets.any:  # a target moves a request only this far from the cheapest
        names = [n for n in names if cost[n] <= (1.0 + regret) * min(cost.values())]
    meets = [n for n in names if targets.shortfall(predicted[n]) <= 1.0]
    assert chosen.met == bool(meets)
    assert chosen.route in chosen.allowed
    if meets:
        assert set(chosen.allowed) == set(meets)
        assert cost[chosen.route] == min(cost[n] for n in meets)
    else:
        best = min(targets.shortfall(predicted[n]) for n in names)
        assert targets.shortfall(predicted[chosen.route]) == best
    # The same inputs, the same pick.
    assert pick(names, predicted, cost, targets, regret) == chosen


def _policy_and_features(**overrides: object) -> tuple[ProfiledPolicy, RequestFeatures]:
    """The pair on the built-in GPU prior (a draft model at k=4 prefills ~10% slower),
    read as measured; a structured 3000-token prompt, `max_tokens` 32, streamed."""
    routes = two_routes(k=4, draft_cost_ratio=0.1)
    profile = dataclasses.replace(prior_profile(routes), source="test")
    policy = ProfiledPolicy(RouterConfig(**overrides), routes=routes, profile=profile)  # type: ignore[arg-type]
    f = RequestFeatures(
        Endpoint.CHAT, True, 0.0, None, 3000, 32, 32, True, 1, False, Workload.STRUCTURED
    )
    return policy, f


def test_the_router_takes_a_route_that_meets_the_target_and_says_why() -> None:
    policy, f = _policy_and_features()
    state = LiveState.pair(BackendState(), BackendState())
    plain = policy.decide(f, state)
    assert (plain.route, plain.reason) == (Route.SPECULATIVE, "spec-predicted-faster")
    assert plain.why is not None and "targets" not in plain.why
    # First token 105 ms without the draft, 115.5 ms with it: a 110 ms target moves it
    # to the baseline, whose cost is within 25% of the speculative route's.
    aimed = policy.decide(dataclasses.replace(f, targets=LatencyTargets(ttft_s=0.110)), state)
    assert (aimed.route, aimed.reason) == (Route.BASELINE, "latency-target")
    assert aimed.why is not None
    assert aimed.why["targets"] == {"ttft_ms": 110.0, "met": True}
    assert aimed.why["rule"] == "targets"
    # 50 ms: no route meets it; the closest answers, and says so.
    missed = policy.decide(dataclasses.replace(f, targets=LatencyTargets(ttft_s=0.05)), state)
    assert missed.route == Route.BASELINE and missed.why is not None
    assert missed.why["targets"] == {"ttft_ms": 50.0, "met": False}
    # A target never buys a route past explore_max_regret: at 10% the baseline (17%
    # dearer) is out, and the speculative route answers, predicted to miss.
    policy, f = _policy_and_features(explore_max_regret=0.1)
    bound = policy.decide(dataclasses.replace(f, targets=LatencyTargets(ttft_s=0.110)), state)
    assert bound.route == Route.SPECULATIVE and bound.why is not None
    assert bound.why["targets"] == {"ttft_ms": 110.0, "met": False}
    # Exploration draws only among the routes the target allows.
    for seed in range(20):
        drawn = policy.decide(
            dataclasses.replace(f, targets=LatencyTargets(ttft_s=0.110)), state, random.Random(seed)
        )
        assert drawn.route == Route.SPECULATIVE
