"""Traffic in bursts of one kind at a time (the README demo's shape), on ONE GPU at
concurrency 2 (tooling/sim/shared_gpu.py: the emulator's step costs in virtual time), through the
profiled policy on the profile a profiler would measure of that GPU.

Each burst's whole batch belongs on the server that suits its kind: speculative for
structured output and code, the baseline for creative text and long prompts. A gateway
that has learned every kind must choose per burst, not keep the server it measured fast
on the previous one.
"""

from __future__ import annotations

import pytest

from classifier import StaticPolicy
from classifier.types import PAIR
from tooling.sim.shared_gpu import Job, jobs, mean_latency, profiled, simulate
from tooling.workloads import MIXES

pytestmark = pytest.mark.slow


def bursts(per_workload: int, seed: int) -> list[list[Job]]:
    return [jobs(per_workload, seed=seed + i, names=[name]) for i, name in enumerate(MIXES["demo"])]


@pytest.mark.parametrize("warm", [True, False])
def test_each_burst_is_served_on_the_server_that_suits_it(warm: bool) -> None:
    """6 requests of each kind, after 12 of each (warm) or from the start-up profile
    alone: within 5% of the better static route per burst, on average over three seeds.
    Measured in this sim (seeds 100, 300, 500): warm 1.000, 1.000, 1.000 (1.052, 1.031,
    1.032 before the router learned how much the traffic's next kind follows its last);
    cold 1.000, 1.000, 1.000."""
    ratios = []
    for seed in (100, 300, 500):
        policy = profiled()
        if warm:
            for burst in bursts(12, seed=seed):
                simulate(policy, burst, 2)
        ours = best = 0.0
        for burst in bursts(6, seed=seed + 100):
            statics = [mean_latency(simulate(StaticPolicy(r), burst, 2)) for r in PAIR]
            ours += mean_latency(simulate(policy, burst, 2))
            best += min(statics)
        ratios.append(ours / best)
    print(f"warm={warm}: {[round(r, 3) for r in ratios]}")
    assert sum(ratios) / len(ratios) <= 1.05, ratios
