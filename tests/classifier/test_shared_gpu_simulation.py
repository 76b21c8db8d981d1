"""The cost model on ONE GPU under load (shared_gpu_sim: the emulator's step costs in
virtual time). Splitting a busy GPU's batch over two servers makes everyone slower, so
under load the policy must keep up with the better static route, and routing each
request as if the servers had a GPU each must do clearly worse (why consolidation
exists). On an idle GPU each request still goes where it is fastest, and with a GPU
per server (gpus=2) always.

Print the table with: .venv/bin/python tests/classifier/shared_gpu_sim.py
"""

from __future__ import annotations

import pytest
from shared_gpu_sim import (
    jobs,
    mean_latency,
    oracle_latency,
    simulate,
)

from classifier import Route, StaticPolicy
from classifier.costmodel import CostModelConfig, CostModelPolicy

SPEC, BASE = Route.SPECULATIVE, Route.BASELINE
REQUESTS = jobs(100, seed=3)

pytestmark = pytest.mark.slow


def test_an_idle_gpu_routes_each_request_to_its_faster_server() -> None:
    ours = mean_latency(simulate(CostModelPolicy(CostModelConfig()), REQUESTS, 1))
    spec = simulate(StaticPolicy(SPEC), REQUESTS, 1)
    base = simulate(StaticPolicy(BASE), REQUESTS, 1)
    assert ours < min(mean_latency(spec), mean_latency(base)) / 1.1
    assert ours <= 1.05 * oracle_latency(spec, base)


@pytest.mark.parametrize("concurrency", [8, 32])
def test_under_load_it_keeps_up_with_the_better_static_route(concurrency: int) -> None:
    policy = CostModelPolicy(CostModelConfig())
    served = simulate(policy, REQUESTS, concurrency)
    ours = mean_latency(served)
    statics = [mean_latency(simulate(StaticPolicy(r), REQUESTS, concurrency)) for r in (SPEC, BASE)]
    unaware = CostModelPolicy(CostModelConfig(shared_gpu=False))
    split = mean_latency(simulate(unaware, REQUESTS, concurrency))
    # Measured in this sim: 1.024x the better static at 8, 1.005x at 32 (trials
    # included); routing per request as if on two GPUs: 1.13x and 1.23x.
    assert ours <= 1.05 * min(statics), (ours / min(statics), statics)
    assert split > 1.08 * min(statics)  # the per-request split the target prevents
    assert ours < 0.96 * split
    assert policy.consolidation_trials() >= 1  # it measured both servers at this load
    assert sum(s.reason == "consolidate" for s in served) > 0.8 * len(served)


@pytest.mark.parametrize("concurrency", [8, 32])
def test_with_a_gpu_per_server_each_request_goes_where_it_is_fastest(concurrency: int) -> None:
    """Two GPUs: nothing to consolidate, and the router spreads the load over both.
    Measured in this sim: 0.63x the better static at 8 and 0.58x at 32; 0.74x and
    0.63x the per-request oracle (whose static runs leave one GPU idle)."""
    policy = CostModelPolicy(CostModelConfig(shared_gpu=False))
    ours = mean_latency(simulate(policy, REQUESTS, concurrency, gpus=2))
    spec = simulate(StaticPolicy(SPEC), REQUESTS, concurrency, gpus=2)
    base = simulate(StaticPolicy(BASE), REQUESTS, concurrency, gpus=2)
    assert ours < 0.8 * min(mean_latency(spec), mean_latency(base))
    assert ours <= 1.10 * oracle_latency(spec, base)
