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
    policy = CostModelPolicy(CostModelConfig(shared_gpu=True))
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
    # It measured both servers at 8; at 32 the guard (spec_max_inflight 16) leaves
    # only the baseline to carry the batch, and nothing to try.
    assert policy.consolidation_trials() >= (1 if concurrency == 8 else 0)
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


@pytest.mark.parametrize("concurrency", [8, 32])
@pytest.mark.parametrize("gpus", [1, 2])
def test_auto_measures_the_topology_and_pays_little_for_it(concurrency: int, gpus: int) -> None:
    """The default (shared_gpu = "auto") starts as if on one GPU and probes. Measured
    in this sim, seeds 3-5: one GPU 1.03-1.09x the better static at 8 and 1.06-1.08x
    at 32 (5-13 probes; told the topology: 1.006 and 1.015); a GPU each 0.71x and
    0.65x (told: 0.64 and 0.59; before "auto", the default true gave ~1.0)."""
    policy = CostModelPolicy(CostModelConfig())
    ours = mean_latency(simulate(policy, REQUESTS, concurrency, gpus=gpus))
    best = min(
        mean_latency(simulate(StaticPolicy(r), REQUESTS, concurrency, gpus=gpus))
        for r in (SPEC, BASE)
    )
    shared, _, probes = policy.topology()
    assert shared is (gpus == 1)
    assert probes <= 16
    assert ours <= (1.12 if gpus == 1 else 0.8) * best, ours / best


def test_measuring_the_topology_does_not_starve_the_carriers_measurements() -> None:
    """A fresh gateway (defaults: topology "auto") after 200 requests at concurrency 1
    meets concurrency 8 for the first time: 128 requests of warm-up, then 128 measured,
    six seeds. The probes beside the batch must not hold back the verdict on which server
    carries it. Measured in this sim: 1.019x the better static route on average (worst
    1.061); leaving out 2 x batch completions after each probe, 1.076x (worst 1.128)."""
    ratios = []
    for seed in range(0, 6000, 1000):
        policy = CostModelPolicy(CostModelConfig())
        simulate(policy, jobs(34, seed=1 + seed), 1)
        simulate(policy, jobs(22, seed=108 + seed), 8)
        measured = jobs(22, seed=8 + seed)
        best = min(mean_latency(simulate(StaticPolicy(r), measured, 8)) for r in (SPEC, BASE))
        ratios.append(mean_latency(simulate(policy, measured, 8)) / best)
    assert sum(ratios) / len(ratios) <= 1.05, ratios
