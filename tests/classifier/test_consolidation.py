"""One GPU under load: the batch stays on one server, the one measured faster at that load."""

from __future__ import annotations

from typing import Any

import pytest
from costmodel_sim import features

from classifier.consolidation import ConsolidationTarget
from classifier.costmodel import CostModelConfig, CostModelPolicy
from classifier.features import Workload
from classifier.policy import BackendState, LiveState, Route

SPEC, BASE = Route.SPECULATIVE, Route.BASELINE
BOTH = frozenset((SPEC, BASE))


def busy(spec: int, base: int) -> dict[Route, int]:
    return {SPEC: spec, BASE: base}


def measured(target: ConsolidationTarget, route: Route, per_unit: float, batch: int = 8) -> None:
    for _ in range(20):
        target.observed(route, batch, latency_s=per_unit, size_s=1.0)


def test_follows_load_it_did_not_move_there() -> None:
    target = ConsolidationTarget(initial=BASE)
    assert target.update(busy(3, 0), BOTH) is SPEC
    assert target.trials == 0


def test_does_not_follow_load_to_a_route_measured_slower_on_a_few_requests() -> None:
    """An idle GPU's choice put a request on the speculative server; at this load it
    was measured 24% slower than the carrier on 6 requests each (fewer than a verdict
    needs): the batch stays, and that request drains. Within the margin it follows."""
    target = ConsolidationTarget(margin=0.05, initial=BASE)
    for _ in range(6):
        target.observed(SPEC, 8, latency_s=2.05, size_s=1.0)
        target.observed(BASE, 8, latency_s=1.66, size_s=1.0)
    target.update(busy(0, 7), BOTH)  # the load it has been under
    assert target.update(busy(1, 0), BOTH) is BASE
    close = ConsolidationTarget(margin=0.05, initial=BASE)
    for _ in range(6):
        close.observed(SPEC, 8, latency_s=1.70, size_s=1.0)  # 2.4% slower: within it
        close.observed(BASE, 8, latency_s=1.66, size_s=1.0)
    close.update(busy(0, 7), BOTH)
    assert close.update(busy(1, 0), BOTH) is SPEC


def test_tries_a_route_unmeasured_at_this_load_then_keeps_the_faster() -> None:
    target = ConsolidationTarget(trial_length=4, retry_after=100, initial=BASE)
    measured(target, BASE, 2.0)
    assert target.update(busy(0, 7), BOTH) is SPEC  # never measured at batch 8: a trial
    assert target.trials == 1
    for _ in range(3):  # held for the trial, while the baseline drains
        assert target.update(busy(2, 5), BOTH) is SPEC
    measured(target, SPEC, 3.0)
    assert target.update(busy(7, 0), BOTH) is BASE  # slower: back, once baseline is idle
    assert target.update(busy(5, 2), BOTH) is BASE  # and the speculative server drains
    assert target.per_unit(SPEC, 8) == pytest.approx(3.0)
    assert target.per_unit(BASE, 9) == pytest.approx(2.0)  # same power of two


def test_keeps_a_trial_route_that_measures_faster() -> None:
    target = ConsolidationTarget(trial_length=2, retry_after=100, initial=BASE)
    measured(target, BASE, 2.0)
    assert target.update(busy(0, 7), BOTH) is SPEC
    measured(target, SPEC, 1.5)
    for _ in range(5):
        assert target.update(busy(7, 0), BOTH) is SPEC


def test_a_margin_keeps_it_from_flapping() -> None:
    target = ConsolidationTarget(margin=0.05, retry_after=100, initial=SPEC)
    measured(target, SPEC, 2.0)
    measured(target, BASE, 1.95)  # 2.5% better: not enough to move the batch
    assert target.update(busy(7, 0), BOTH) is SPEC
    for _ in range(20):
        target.observed(BASE, 8, latency_s=1.7, size_s=1.0)  # now clearly better
    assert target.update(busy(7, 0), BOTH) is BASE


def test_never_switches_while_the_old_target_still_holds_requests() -> None:
    target = ConsolidationTarget(trial_length=1, retry_after=100, initial=BASE)
    measured(target, BASE, 2.0)
    target.update(busy(0, 7), BOTH)  # trial: SPEC, baseline draining
    measured(target, SPEC, 4.0)  # far slower, but baseline still holds requests
    for _ in range(10):
        assert target.update(busy(3, 4), BOTH) is SPEC
    assert target.update(busy(7, 0), BOTH) is BASE


def test_retries_a_route_not_measured_for_a_while() -> None:
    target = ConsolidationTarget(trial_length=1, retry_after=10, initial=BASE)
    measured(target, BASE, 2.0)
    target.update(busy(0, 7), BOTH)  # trial of SPEC
    measured(target, SPEC, 4.0)
    assert target.update(busy(7, 0), BOTH) is BASE
    routes = [target.update(busy(0, 7), BOTH) for _ in range(12)]
    measured(target, BASE, 2.0)  # baseline keeps being measured; SPEC's is now stale
    assert SPEC in routes and target.trials == 2


def test_each_load_is_measured_on_its_own() -> None:
    target = ConsolidationTarget(trial_length=1, retry_after=100, initial=BASE)
    measured(target, BASE, 2.0, batch=8)
    measured(target, SPEC, 4.0, batch=8)
    assert target.update(busy(0, 7), BOTH) is BASE  # batch 8: both known, baseline faster
    routes = [target.update(busy(0, 31), BOTH) for _ in range(30)]  # the load rises to 32
    assert set(routes) == {BASE}  # nothing measured at 32 yet: no trial against nothing
    measured(target, BASE, 2.0, batch=32)
    routes = [target.update(busy(0, 31), BOTH) for _ in range(3)]
    assert SPEC in routes  # the carrier is known at 32, speculative never tried there: a trial
    assert target.per_unit(SPEC, 32) is None
    assert target.per_unit(BASE, 11) == pytest.approx(2.0)  # 6-11 share the bucket of 8


def test_a_momentary_dip_in_load_starts_no_trial() -> None:
    """Two answers finishing together leave batch 6 for an instant; only batch 8 is
    measured on both routes, and a trial at 6 would move the whole batch for nothing."""
    target = ConsolidationTarget(trial_length=4, retry_after=100, initial=BASE)
    measured(target, BASE, 2.0, batch=16)
    measured(target, SPEC, 4.0, batch=16)
    routes = [target.update(busy(0, 5 if i % 10 == 9 else 15), BOTH) for i in range(60)]
    assert set(routes) == {BASE} and target.trials == 0


def test_does_not_follow_load_onto_a_route_measured_slower() -> None:
    """An idle GPU's per-request choice put one request on the speculative server;
    the next ones stay on the baseline, measured faster at this load, and it drains."""
    target = ConsolidationTarget(initial=BASE)
    measured(target, BASE, 2.0)
    measured(target, SPEC, 4.0)
    assert target.update(busy(7, 0), BOTH) is BASE
    assert target.update(busy(6, 1), BOTH) is BASE


def test_a_few_fast_requests_earn_a_trial_not_a_verdict() -> None:
    """Five requests are not a measurement, so they cannot move the batch for good; but
    when they look faster they start a trial, which measures that route properly
    (before, they blocked every trial for retry_after decisions: in virtual time at
    concurrency 8 with k = 8 the batch stayed on a server 36% slower)."""
    target = ConsolidationTarget(retry_after=1000, trial_length=4, dwell=10, initial=SPEC)
    measured(target, SPEC, 2.0)
    for _ in range(5):
        target.observed(BASE, 8, latency_s=1.0, size_s=1.0)
    assert target.update(busy(7, 0), BOTH) is BASE
    assert target.trials == 1
    for _ in range(4):  # the trial measures the baseline slower after all
        assert target.update(busy(2, 5), BOTH) is BASE
    measured(target, BASE, 3.0)
    assert target.update(busy(0, 7), BOTH) is SPEC
    routes = [target.update(busy(7, 0), BOTH) for _ in range(30)]
    assert set(routes) == {SPEC} and target.trials == 1


def test_a_few_slow_requests_start_nothing() -> None:
    target = ConsolidationTarget(retry_after=1000, dwell=10, initial=SPEC)
    measured(target, SPEC, 2.0)
    for _ in range(5):
        target.observed(BASE, 8, latency_s=3.0, size_s=1.0)
    routes = [target.update(busy(7, 0), BOTH) for _ in range(30)]
    assert set(routes) == {SPEC} and target.trials == 0


def test_a_route_a_guard_rules_out_never_carries_the_batch() -> None:
    target = ConsolidationTarget(initial=SPEC)
    assert target.update(busy(20, 0), frozenset((BASE,))) is BASE
    for _ in range(3):  # no trial of the ruled-out route either
        assert target.update(busy(10, 10), frozenset((BASE,))) is BASE
        assert target.update(busy(0, 20), frozenset((BASE,))) is BASE
    assert target.trials == 0
    fresh = ConsolidationTarget(initial=BASE)  # nor is load followed onto it
    assert fresh.update(busy(3, 0), frozenset((BASE,))) is BASE


def test_odd_measurements_are_ignored() -> None:
    target = ConsolidationTarget()
    for latency, size in ((0.0, 1.0), (1.0, 0.0), (float("nan"), 1.0), (float("inf"), 1.0)):
        target.observed(SPEC, 8, latency, size)
    assert target.per_unit(SPEC, 8) is None


@pytest.mark.parametrize(
    "bad", [{"margin": -0.1}, {"margin": 1.0}, {"retry_after": 0}, {"trial_length": 0}]
)
def test_config_is_validated(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="consolidation"):
        ConsolidationTarget(**bad)


def test_a_queue_on_the_carrier_sends_the_request_to_the_server_with_room() -> None:
    """Baseline saturated (32 running, 68 waiting), speculative idle: before the fix the
    whole batch stayed on the baseline and a request waited 35 s behind its queue."""
    policy = CostModelPolicy(CostModelConfig(shared_gpu=True))
    f = features(Workload.CHAT, 200, 128, 0.7)
    saturated = LiveState(
        BackendState(inflight=0, running=0, waiting=0),
        BackendState(inflight=100, running=32, waiting=68),
    )
    decision = policy.decide(f, saturated)
    assert decision.route is Route.SPECULATIVE
    assert decision.reason in ("avoid-queue", "consolidate")
    # a big speculative batch (its spec-busy guard) still beats a queue...
    busy_spec = LiveState(
        BackendState(inflight=20, running=20, waiting=0),
        BackendState(inflight=100, running=32, waiting=68),
    )
    assert policy.decide(f, busy_spec).reason == "avoid-queue"
    # ...a nearly full KV cache does not: it would preempt
    full_kv = LiveState(
        BackendState(inflight=20, running=20, waiting=0, kv_cache_usage=0.95),
        BackendState(inflight=100, running=32, waiting=68),
    )
    assert policy.decide(f, full_kv).route is Route.BASELINE
    # a queue on the speculative server too: nowhere better to go
    both_queued = LiveState(
        BackendState(inflight=4, running=4, waiting=6),
        BackendState(inflight=100, running=32, waiting=68),
    )
    assert policy.decide(f, both_queued).reason != "avoid-queue"
    # a few waiting beside a busy batch (arrived mid-step) is no queue: the batch stays
    transient = LiveState(
        BackendState(inflight=0, running=0, waiting=0),
        BackendState(inflight=8, running=8, waiting=2),
    )
    assert policy.decide(f, transient).reason != "avoid-queue"


def test_a_prediction_too_close_to_call_keeps_the_carrier() -> None:
    """No lean (the batch's predicted ratio within the margin): nothing measured, and
    the carrier stays; a lean moves it once the other server is idle."""
    target = ConsolidationTarget(initial=BASE)
    assert [target.update(busy(0, 3), BOTH, lean=None) for _ in range(10)] == [BASE] * 10
    assert target.update(busy(0, 3), BOTH, lean=SPEC) is SPEC


def test_an_unmeasured_load_follows_the_prediction_for_the_batch() -> None:
    """On a fresh gateway the first carrier under load is the one the cost model predicts
    faster for the batch, not a fixed one followed by a 64-request trial of the other
    (the README demo sent structured requests 4 of 6 to the baseline that way)."""
    target = ConsolidationTarget(initial=BASE)
    routes = [target.update(busy(0, 1), BOTH, lean=SPEC)]  # the baseline still holds one
    routes += [target.update(busy(1, 0), BOTH, lean=SPEC) for _ in range(10)]
    assert routes[-10:] == [SPEC] * 10 and target.trials == 0
