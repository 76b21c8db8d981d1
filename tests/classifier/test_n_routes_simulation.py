"""The profiled policy over three or four routes (issue 42), in virtual time on the measured
H200 (tooling/sim/shared_gpu.py: each route an emulated server with its own drafter and k,
each request's true acceptance per drafter, the profile a profiler would measure of every
route). Each workload must go to the route whose true cost is lowest for it; a route whose
probes were wrong must learn its own truth from its own answers, and no other route's
belief may move with it; the gateway must stay near the per-request oracle over all routes.

The full table: .venv/bin/python benchmarks/n_routes.py
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import pytest

from classifier import Route, StaticPolicy, Workload
from tooling.sim.shared_gpu import (
    FOUR_ROUTES,
    Job,
    Served,
    SimRoute,
    jobs,
    mean_latency,
    oracle_latency,
    profiled,
    sim_route,
    simulate,
)

NONE, EAGLE_K3, EAGLE_K7, NGRAM_K8 = FOUR_ROUTES
THREE_ROUTES = (NONE, EAGLE_K3, EAGLE_K7)
# A menu without the EAGLE head: the 1B draft model at k=4 and n-gram lookup, where
# creative text and chat are cheapest without speculation.
WITHOUT_EAGLE = (NONE, sim_route("draft1b-k4", "draft-1b", 4), NGRAM_K8)
REQUESTS = jobs(30, seed=21)

pytestmark = pytest.mark.slow


def statics(routes: Sequence[SimRoute], requests: Sequence[Job]) -> dict[Route, list[Served]]:
    return {r.name: simulate(StaticPolicy(r.name), requests, 1, routes=routes) for r in routes}


def cheapest(runs: dict[Route, list[Served]], workload: str) -> tuple[Route, float]:
    """The route whose static run served `workload` fastest, and its margin over the next."""
    means = {
        r: statistics.fmean(s.duration_s for s in served if s.job.workload == workload)
        for r, served in runs.items()
    }
    ranked = sorted(means, key=means.__getitem__)
    return ranked[0], means[ranked[1]] / means[ranked[0]]


@pytest.mark.parametrize(
    ("routes", "expected"),
    [
        (
            FOUR_ROUTES,
            {
                "structured": "eagle3-k7",
                "sql": "eagle3-k7",
                "code": "eagle3-k7",
                "creative": "eagle3-k3",
                "chat": "eagle3-k3",
            },
        ),
        (
            WITHOUT_EAGLE,
            {
                "structured": "draft1b-k4",
                "sql": "draft1b-k4",
                "code": "draft1b-k4",
                "creative": "none",
                "chat": "none",
            },
        ),
    ],
    ids=["four-routes", "none-1b-ngram"],
)
def test_each_workload_goes_to_the_route_whose_true_cost_is_lowest(
    routes: Sequence[SimRoute], expected: dict[str, str]
) -> None:
    """The truth first (each workload's static runs: the cheapest route by at least 5%, so
    the test cannot pass on a tie), then a fresh gateway over the same requests. In the
    second half every decision on the posterior mean (all but the Thompson draws, reason
    "explore") sends each workload to that route, and the draws stay a minority. Measured
    in this sim (seed 21): four routes, 0 of 15 structured, SQL and code requests explored,
    2 of 15 creative and chat; without EAGLE, code 2, creative 4 and chat 6 of 15, all on
    ngram-k8 (its probes measured about 1 token per step, but the prior's spread, 0.2 in
    rate, times k=8 still draws up to 2)."""
    runs = statics(routes, REQUESTS)
    for workload, route in expected.items():
        best, margin = cheapest(runs, workload)
        assert (best, margin > 1.05) == (route, True), (workload, best, margin)
    served = simulate(profiled(routes=routes), REQUESTS, 1, routes=routes, seed=21)
    late = served[len(served) // 2 :]
    for workload, route in expected.items():
        mine = [s for s in late if s.job.workload == workload]
        drawn = [s for s in mine if s.reason == "explore"]
        print(f"{workload}: {len(drawn)} of {len(mine)} explored")
        assert all(s.route == route for s in mine if s.reason != "explore"), workload
        assert len(drawn) <= 0.4 * len(mine), workload


@pytest.mark.parametrize(
    ("wrong", "workload", "probe"),
    [
        (EAGLE_K7, Workload.CODE, 0.65),  # underrated: truth 0.74 at temperature 0
        (EAGLE_K7, Workload.CHAT, 0.9),  # overrated: truth 0.50 at temperature 0.7
    ],
    ids=["underrated", "overrated"],
)
def test_a_probe_wrong_for_one_route_is_outweighed_by_its_drafters_answers(
    wrong: SimRoute, workload: Workload, probe: float
) -> None:
    """One route's probes say `probe` for one workload; every other probe is the emulator's
    own. Both EAGLE routes share the drafter's belief of a: it starts between the wrong
    probe and the right one, and after the run every route of the drafter believes the
    truth of the drafter's answers, whichever route they came from."""
    policy = profiled(routes=THREE_ROUTES, probes_of={wrong.name: {workload: probe}})
    before = policy.estimated_acceptance()
    right = next(r for r in THREE_ROUTES[1:] if r.name != wrong.name)
    assert before[wrong.name][workload] == before[right.name][workload]
    assert abs(before[wrong.name][workload] - probe) > 0.02  # averaged with the right one
    requests = jobs(40, seed=22)
    simulate(policy, requests, 1, routes=THREE_ROUTES, seed=22)
    believed = policy.estimated_acceptance()
    truth = statistics.fmean(
        j.acceptance_on(right) for j in requests if j.features.workload is workload
    )
    for route in THREE_ROUTES[1:]:
        print(f"{route.name}: believed {believed[route.name][workload]:.3f}, truth {truth:.3f}")
        assert believed[route.name][workload] == pytest.approx(truth, abs=0.06), route.name


def test_the_gateway_over_four_routes_stays_near_their_oracle() -> None:
    """A fresh gateway (learning from the profile's probes) at c=1 over the four routes
    against the per-request oracle over the four static runs. Measured in this sim: 1.027x
    the oracle, 0.986x the best static route (eagle3-k3); benchmarks/n_routes.py has the
    longer runs."""
    runs = statics(FOUR_ROUTES, REQUESTS)
    oracle = oracle_latency(*runs.values())
    ours = mean_latency(simulate(profiled(routes=FOUR_ROUTES), REQUESTS, 1, routes=FOUR_ROUTES))
    best_static = min(mean_latency(served) for served in runs.values())
    print(f"{ours / oracle:.3f}x the oracle, {ours / best_static:.3f}x the best static route")
    assert ours <= 1.05 * oracle
    assert ours < best_static


@pytest.mark.parametrize(
    ("c", "per_workload", "seed", "bound"), [(8, 20, 23, 1.20), (32, 100, 5, 1.12)]
)
def test_under_load_one_gpu_keeps_up_with_the_best_static_route(
    c: int, per_workload: int, seed: int, bound: float
) -> None:
    """Four servers time-sliced on one GPU, a closed loop that starts as a burst of c: the
    batch belongs on one server. Measured in this sim: 1.074x at c=32 (mostly on one of
    eagle3-k3 and eagle3-k7, 1.000 and 1.058 alone); 1.150x at c=8 on 120 requests, where eagle3-k3 and
    eagle3-k7 carry the mix within 3% of each other (the model predicts them 0.446 and
    0.447 s a request against 0.472 and 0.484 measured): a Thompson draw splits the first
    batch over both and it moves to eagle3-k7 over a few lives. The carrier rule before
    the one cost model held 1.000 at both here but 1.10-1.84x on open-loop mixed traffic
    (docs/benchmarks.md); these bounds are that trade, not a goal."""
    requests = jobs(per_workload, seed=seed)
    best = min(
        mean_latency(simulate(StaticPolicy(r.name), requests, c, routes=FOUR_ROUTES))
        for r in FOUR_ROUTES
    )
    served = simulate(profiled(routes=FOUR_ROUTES), requests, c, routes=FOUR_ROUTES)
    print(f"{mean_latency(served) / best:.3f}x the best static route")
    assert mean_latency(served) <= bound * best
    busiest = max(sum(s.route == r.name for s in served) for r in FOUR_ROUTES)
    assert busiest > 0.85 * len(served)  # one server carries the batch
