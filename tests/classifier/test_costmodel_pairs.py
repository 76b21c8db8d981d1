"""A host with N GPUs, a pair per GPU: each pair consolidates and measures its own
topology, and all pairs learn one model (acceptance, latency, output length).

Before, the policy had one consolidation target, one topology verdict and one
batch lean for the whole host: two pairs with different traffic shared one
carrier, so one of them split its batch across both servers of its GPU.
"""

from __future__ import annotations

from collections import Counter, deque

from costmodel_sim import features

from classifier.acceptance import AcceptancePriors
from classifier.consolidation import ConsolidationTarget, LoadMeasurements
from classifier.costmodel import CostModelConfig, CostModelPolicy, Observation
from classifier.features import RequestFeatures, Workload
from classifier.policy import BackendState, LiveState, Route, RulesConfig, RulesPolicy, StaticPolicy
from gateway.record import Lesson

SPEC, BASE = Route.SPECULATIVE, Route.BASELINE
IDLE = LiveState(BackendState(), BackendState())
STRUCTURED = features(Workload.STRUCTURED, 300, 256, 0.0)
CREATIVE = features(Workload.CREATIVE, 100, 400, 1.2)
# As if measured: structured output drafts well, creative text badly.
MEASURED = AcceptancePriors(structured=0.9, creative=0.1)
ONE_GPU = CostModelConfig(explore_share=0.0, shared_gpu=True, acceptance=MEASURED)


def busy(queue: deque[Route]) -> LiveState:
    return LiveState(
        BackendState(inflight=queue.count(SPEC)), BackendState(inflight=queue.count(BASE))
    )


def run_pairs(
    policy: CostModelPolicy, traffic: dict[int, RequestFeatures], rounds: int, depth: int = 4
) -> dict[int, Counter[Route]]:
    """Each pair keeps `depth` requests in flight (the oldest finishes as the next is
    decided), starting from a batch on its baseline server; the pairs' decisions
    interleave, as the gateway's do. Returns the routes of the last half, per pair."""
    inflight = {pair: deque([BASE] * depth) for pair in traffic}
    routes: dict[int, Counter[Route]] = {pair: Counter() for pair in traffic}
    for i in range(rounds):
        for pair, f in traffic.items():
            queue = inflight[pair]
            queue.popleft()
            decision = policy.decide(f, busy(queue), pair=pair)
            assert decision.reason == "consolidate"
            queue.append(decision.route)
            if i >= rounds // 2:
                routes[pair][decision.route] += 1
    return routes


def test_two_pairs_consolidate_independently() -> None:
    """Pair 0 carries structured output, pair 1 creative text, both starting with a
    batch on the baseline: pair 0 moves its whole batch to the speculative server,
    pair 1 keeps its whole batch on the baseline. With one target and one lean for
    both (the old policy), pair 0's move took pair 1's creative text along: all of
    it on the speculative server, split across pair 1's GPU while its batch moved."""
    policy = CostModelPolicy(ONE_GPU)
    routes = run_pairs(policy, {0: STRUCTURED, 1: CREATIVE}, rounds=40)
    assert routes[0] == Counter({SPEC: 20})
    assert routes[1] == Counter({BASE: 20})
    assert (policy.carrier(0), policy.carrier(1)) == (SPEC, BASE)


def test_one_pair_alone_decides_as_before() -> None:
    """pair=0 is the default: a single-pair gateway's decisions are unchanged."""
    a, b = CostModelPolicy(ONE_GPU), CostModelPolicy(ONE_GPU)
    queue = deque([BASE, BASE, SPEC])
    for f in (STRUCTURED, CREATIVE, STRUCTURED, STRUCTURED):
        assert a.decide(f, busy(queue)) == b.decide(f, busy(queue), pair=0)


def test_a_pair_is_judged_on_what_every_pair_measured() -> None:
    """The consolidation's measurements are shared (same model, same class of GPU):
    pair 1, which measured nothing, moves its batch to the server pair 0 measured
    faster at this load. With its own table it had nothing to compare and stayed."""
    shared = LoadMeasurements()
    pair0 = ConsolidationTarget(measurements=shared)
    for _ in range(20):  # at a load of 8: the speculative server twice as fast
        pair0.observed(SPEC, 8, latency_s=1.0, size_s=1.0)
        pair0.observed(BASE, 8, latency_s=2.0, size_s=1.0)
    pair1 = ConsolidationTarget(initial=BASE, measurements=shared)
    assert pair1.update({SPEC: 0, BASE: 7}, frozenset((SPEC, BASE))) is SPEC
    alone = ConsolidationTarget(initial=BASE)
    assert alone.update({SPEC: 0, BASE: 7}, frozenset((SPEC, BASE))) is BASE


def lesson(pair: int, acceptance: float) -> Lesson:
    state = LiveState(BackendState(inflight=1), BackendState())
    return Lesson(SPEC, STRUCTURED, state, 0.05, 0.9, 300, 256, acceptance, None, pair)


def test_learning_on_pair_1_moves_the_shared_acceptance() -> None:
    """Same model on the same hardware: what pair 1's speculative server measured is
    what pair 0's decisions use."""
    learned, fresh = CostModelPolicy(ONE_GPU), CostModelPolicy(ONE_GPU)
    for _ in range(10):
        learned.learn(lesson(pair=1, acceptance=0.05))
    believed = learned.estimated_acceptance()[Workload.STRUCTURED]
    assert believed < fresh.estimated_acceptance()[Workload.STRUCTURED] - 0.3
    # pair 0 never saw a request, and predicts with it: speculation now looks slow
    assert learned.predict(STRUCTURED, IDLE, pair=0)[SPEC] > fresh.predict(STRUCTURED, IDLE)[SPEC]
    assert learned.decide(STRUCTURED, IDLE, pair=0).route is BASE
    assert fresh.decide(STRUCTURED, IDLE, pair=0).route is SPEC


def probe_pair(policy: CostModelPolicy, pair: int) -> int:
    """Decisions under load in `pair` (its batch on the speculative server) until its
    topology probes have been sent; returns how many were."""
    loaded = LiveState(BackendState(inflight=4), BackendState())
    probes = 0
    for _ in range(125):
        probes += policy.decide(STRUCTURED, loaded, pair=pair).reason == "topology-probe"
    return probes


def test_each_pair_measures_its_own_topology() -> None:
    """Pair 1's probes come back as fast as a server alone on its GPU: pair 1 has a
    GPU per server; pair 0, never probed, is still being measured (routed as one GPU)."""
    policy = CostModelPolicy(CostModelConfig(explore_share=0.0, acceptance=MEASURED))
    assert probe_pair(policy, 1) == 5
    for _ in range(5):  # each probe's answer: far faster than waiting for the other's steps
        alone = Observation(
            route=BASE,
            features=STRUCTURED,
            batch=1,
            waiting=0,
            ttft_s=None,
            duration_s=0.01,
            prompt_tokens=300,
            completion_tokens=256,
            acceptance=None,
            predicted_s=None,
            other_batch=4,
            pair=1,
        )
        policy.observe(alone)
    assert policy.shared_gpu(1) is False
    assert policy.shared_gpu(0) is None
    assert policy.topology(0)[2] == 0  # no probe sent in pair 0
    loaded = LiveState(BackendState(inflight=4), BackendState(inflight=0))
    # under load, pair 1 routes each request on its own; pair 0 keeps its batch together
    assert policy.decide(CREATIVE, loaded, pair=1).reason == "baseline-predicted-faster"
    assert policy.decide(CREATIVE, loaded, pair=0).reason in ("consolidate", "topology-probe")


def test_the_rules_and_static_policies_take_a_pair_and_ignore_it() -> None:
    rules, static = RulesPolicy(RulesConfig()), StaticPolicy(BASE)
    for pair in (0, 3):
        assert rules.decide(STRUCTURED, IDLE, pair=pair) == rules.decide(STRUCTURED, IDLE)
        assert static.decide(CREATIVE, IDLE, pair=pair).route is BASE
        assert rules.shared_gpu(pair) is None
