"""Acceptance is learned per drafter, in per-position a: routes of one drafter share it."""

from __future__ import annotations

import pytest

from classifier import Route, RouteSpec
from classifier.beliefs import Acceptance
from classifier.cost import prior_profile
from classifier.speculation import acceptance_rate
from tests.classifier.test_classifier_policy import features

K3, K7 = Route("eagle3-k3"), Route("eagle3-k7")
PRIOR_SD = 0.2


def test_routes_of_one_drafter_share_what_it_learns() -> None:
    """EAGLE at k=3 answers greedy chat at a = 0.75; EAGLE at k=7, never sent it, believes
    the same a, and the rate at its own k (acceptance falls with k at one a)."""
    profile = prior_profile(
        (RouteSpec(Route("none")), RouteSpec(K3, 3, "eagle3"), RouteSpec(K7, 7, "eagle3"))
    )
    acc = Acceptance(PRIOR_SD, 4.0, 1000.0, None, profile)
    greedy = features(temperature=0.0)
    for _ in range(20):
        acc.observe(K3, greedy, acceptance_rate(0.75, 3), per_seq=64)
    on_k7 = acc.belief_for(K7, greedy)
    assert on_k7 is not None and on_k7.mean == pytest.approx(0.75, abs=0.02)
    assert acc.rate(K7, greedy) == pytest.approx(acceptance_rate(0.75, 7), abs=0.02)
    assert acc.rate(K7, greedy) < acc.rate(K3, greedy)
    assert acc.belief_for(Route("none"), greedy) is None
