"""A temperature bucket with no answers borrows its workload's belief, and says how
unsure that is: as far as the buckets with answers sit from their workloads."""

from __future__ import annotations

import random

import pytest

from classifier import Route, RouteSpec, Workload
from classifier.beliefs import Acceptance
from classifier.cost import prior_profile
from classifier.speculation import acceptance_rate
from tests.classifier.test_classifier_policy import features

SPEC = Route.SPECULATIVE
K3, K7 = Route("eagle3-k3"), Route("eagle3-k7")
PRIOR_SD = 0.2


def acceptance() -> Acceptance:
    return Acceptance(PRIOR_SD, 4.0, 1000.0, None, prior_profile())


def answer(acc: Acceptance, workload: Workload, temperature: float, a: float, n: int) -> None:
    """n answers whose per-position acceptance is about `a` (sd 0.03), as rates at k."""
    rng = random.Random(7)
    _, k = acc.drafter(SPEC) or ("", 0)
    for _ in range(n):
        f = features(workload=workload, temperature=temperature)
        rate = acceptance_rate(min(1.0, max(0.0, a + rng.gauss(0.0, 0.03))), k)
        acc.observe(SPEC, f, rate, per_seq=64)


def test_a_bucket_nobody_answered_is_not_as_sure_as_its_workload() -> None:
    """Chat at T=0.8 taught 0.15, sure to 0.01; chat at T=0 (text-to-SQL the markers
    called chat) borrows that mean, but no surer than the buckets' distance allows."""
    acc = acceptance()
    answer(acc, Workload.CHAT, 0.8, 0.15, 60)
    taught = acc.belief_for(SPEC, features(temperature=0.8))
    borrowed = acc.belief_for(SPEC, features(temperature=0.0))
    whole = acc.workload_belief(SPEC, Workload.CHAT)
    assert taught is not None and borrowed is not None and whole is not None
    assert taught.sd < 0.02
    assert abs(borrowed.mean - whole.mean) < 1e-9
    # Nothing measured the distance yet: the prior's.
    assert borrowed.sd > 0.9 * PRIOR_SD
    draws = [borrowed.sample(random.Random(i)) for i in range(200)]
    assert sum(d > 0.35 for d in draws) >= 20  # a draw can find a bucket twice as good


def test_buckets_that_agree_make_a_borrowed_belief_surer() -> None:
    """Four workloads whose greedy and T=0.8 answers agree: the learned distance
    between buckets is small, and a fifth workload's new bucket borrows nearly as is."""
    acc = acceptance()
    for workload, rate in zip(
        (Workload.STRUCTURED, Workload.CODE, Workload.CREATIVE, Workload.LONG_CONTEXT),
        (0.8, 0.7, 0.3, 0.5),
        strict=True,
    ):
        answer(acc, workload, 0.0, rate, 30)
        answer(acc, workload, 0.8, rate, 30)
    answer(acc, Workload.CHAT, 0.8, 0.15, 60)
    assert acc.bucket_sd < 0.5 * PRIOR_SD
    borrowed = acc.belief_for(SPEC, features(temperature=0.0))
    assert borrowed is not None and borrowed.sd < 0.5 * PRIOR_SD


def test_buckets_that_differ_keep_a_borrowed_belief_wide() -> None:
    """Greedy answers 0.3 above T=0.8 ones in every workload: the distance is learned."""
    acc = acceptance()
    for workload, rate in zip(
        (Workload.STRUCTURED, Workload.CODE, Workload.CREATIVE, Workload.LONG_CONTEXT),
        (0.6, 0.5, 0.1, 0.3),
        strict=True,
    ):
        answer(acc, workload, 0.0, rate + 0.3, 30)
        answer(acc, workload, 0.8, rate, 30)
    assert acc.bucket_sd > 0.1


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
