"""CostModelPolicy: guards first, then the smaller prediction, bounded exploration, learning."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from costmodel_sim import Engine, features, outcome
from hypothesis import given, settings
from hypothesis import strategies as st

from classifier import BackendState, GuardsConfig, LiveState, Policy, Route, Workload
from classifier.acceptance import AcceptancePriors
from classifier.costmodel import (
    COST_MODEL_REASONS,
    CostModelConfig,
    CostModelPolicy,
    Observation,
    send_batch,
)
from classifier.policy import DEFAULT_GUARDS
from classifier.speculation import acceptance_rate

SPEC, BASE = Route.SPECULATIVE, Route.BASELINE
IDLE = LiveState(BackendState(), BackendState())
STRUCTURED = features(Workload.STRUCTURED, 300, 256, 0.0)  # a = 0.8: speculation wins
CREATIVE = features(Workload.CREATIVE, 100, 400, 1.2)  # a = 0.25: it loses
CHAT = features(Workload.CHAT, 300, 256, 0.7)  # a = 0.5: close either way
# These tests are about how a decision is made, not about learning: the policy is
# given acceptance as if already measured, per workload (the shipped priors are
# neutral, the same for every workload; test_costmodel_simulation shows learning).
MEASURED = AcceptancePriors(structured=0.8, code=0.75, chat=0.5, creative=0.25, long_context=0.5)
NO_EXPLORE = CostModelConfig(explore_share=0.0, acceptance=MEASURED)


def policy(guards: GuardsConfig = DEFAULT_GUARDS, **config: Any) -> CostModelPolicy:
    return CostModelPolicy(dataclasses.replace(NO_EXPLORE, **config), guards=guards)


def spec_state(**fields: Any) -> LiveState:
    return LiveState(BackendState(**fields), BackendState())


def test_is_a_policy() -> None:
    p: Policy = policy()
    assert p.decide(STRUCTURED, IDLE).route is SPEC


def test_picks_the_smaller_prediction_and_says_so() -> None:
    p = policy()
    d = p.decide(STRUCTURED, IDLE)
    assert d.predicted_s is not None and d.predicted_s[SPEC] < d.predicted_s[BASE]
    assert (d.route, d.reason) == (SPEC, "spec-predicted-faster")
    d = p.decide(CREATIVE, IDLE)
    assert d.predicted_s is not None and d.predicted_s[BASE] < d.predicted_s[SPEC]
    assert (d.route, d.reason) == (BASE, "baseline-predicted-faster")


def test_predictions_match_decision() -> None:
    p = policy()
    d = p.decide(STRUCTURED, IDLE)
    assert d.predicted_s == p.predict(STRUCTURED, IDLE)


def test_long_prompt_short_answer_gains_almost_nothing() -> None:
    p = policy()
    short = p.predict(features(Workload.STRUCTURED, 300, 256, 0.0), IDLE)
    long = p.predict(features(Workload.STRUCTURED, 7000, 8, 0.0), IDLE)
    assert short[BASE] / short[SPEC] > 1.3
    assert long[BASE] / long[SPEC] < 1.05


def test_load_shrinks_speculations_advantage_once_learned() -> None:
    """The priors' speculative step is the baseline's x (1 + k*c) at every batch size;
    the verify pass really computes k + 1 tokens per sequence, and the fit finds it."""
    engine = Engine()
    p = policy(draft_cost_ratio=engine.c, shared_gpu=False)  # the sim engines are independent
    for i in range(600):
        route, batch = (SPEC, BASE)[i % 2], 1 + i % 24
        out = outcome(engine, route, STRUCTURED, batch, seed=i)
        p.observe(
            Observation(
                route,
                STRUCTURED,
                batch,
                0,
                out.ttft_s,
                out.duration_s,
                STRUCTURED.prompt_tokens,
                out.completion_tokens,
                out.acceptance,
                None,
            )
        )

    def advantage(inflight: int) -> float:
        pred = p.predict(
            STRUCTURED, LiveState(BackendState(inflight=inflight), BackendState(inflight=inflight))
        )
        return pred[BASE] / pred[SPEC]

    assert advantage(0) > 1.3
    assert advantage(0) > advantage(8) > advantage(20)


def test_waiting_requests_add_queueing() -> None:
    p = policy()
    calm = p.predict(STRUCTURED, IDLE)[BASE]
    queued = p.predict(STRUCTURED, LiveState(BackendState(), BackendState(waiting=5)))[BASE]
    assert queued > calm


@pytest.mark.parametrize("usage", [0.9, 0.97, 1.0])
def test_kv_pressure_guard(usage: float) -> None:
    d = policy().decide(STRUCTURED, spec_state(kv_cache_usage=usage))
    assert (d.route, d.reason) == (BASE, "kv-pressure")
    assert d.predicted_s is not None and set(d.predicted_s) == {SPEC, BASE}


def test_spec_busy_guard_by_our_count_or_the_servers() -> None:
    assert policy().decide(STRUCTURED, spec_state(inflight=16)).reason == "spec-busy"
    assert policy().decide(STRUCTURED, spec_state(inflight=1, running=20)).reason == "spec-busy"
    assert (
        policy(GuardsConfig(spec_max_inflight=4)).decide(STRUCTURED, spec_state(inflight=4)).reason
        == "spec-busy"
    )
    assert policy().decide(STRUCTURED, spec_state(inflight=15)).route is SPEC


def test_unhealthy_fallback() -> None:
    down = BackendState(healthy=False)
    d = policy().decide(STRUCTURED, LiveState(down, BackendState()))
    assert (d.route, d.reason) == (BASE, "unhealthy-fallback")
    d = policy().decide(CREATIVE, LiveState(BackendState(), down))
    assert (d.route, d.reason) == (SPEC, "unhealthy-fallback")
    both_down = LiveState(down, down)
    assert policy().decide(STRUCTURED, both_down).reason == "spec-predicted-faster"


def test_send_batch() -> None:
    idle = LiveState(BackendState(), BackendState())
    assert send_batch(idle, Route.SPECULATIVE) == 1
    busy = LiveState(BackendState(inflight=3, running=7), BackendState(inflight=5, running=2))
    assert send_batch(busy, Route.SPECULATIVE, n=2) == 9
    assert send_batch(busy, Route.BASELINE) == 6


# ---- exploration ---------------------------------------------------------------------


def test_exploration_share_is_bounded_and_used() -> None:
    p = CostModelPolicy(CostModelConfig(explore_share=0.05, seed=3))
    decisions = [p.decide(CHAT if i % 2 else CREATIVE, IDLE) for i in range(4000)]
    explored = [d for d in decisions if d.reason == "explore"]
    assert 0.04 * 4000 < len(explored) <= 0.05 * 4000 + 5
    assert all(
        d.route is (BASE if d.predicted_s[SPEC] < d.predicted_s[BASE] else SPEC) for d in explored
    )  # type: ignore[index]
    assert p.explore_counts() == (len(explored), 4000)


def test_a_workload_never_measured_is_explored_first() -> None:
    """CREATIVE goes to the baseline and no speculative answer has measured its
    acceptance: the exploration budget goes to it well above the plain share, and
    back to the plain share once it has measurements (no answers are fed back here,
    so the budget's hard bound is what stops it)."""
    p = CostModelPolicy(CostModelConfig(explore_share=0.05, seed=3, acceptance=MEASURED))
    first = [p.decide(CREATIVE, IDLE).reason for _ in range(40)]
    assert first.count("explore") >= 5  # the plain 5% would give 2 on average
    assert p.explore_counts()[0] <= 0.05 * 40 + 5  # the hard bound holds
    for _ in range(40):
        p.observe(observation(SPEC, CREATIVE, acceptance_rate(0.25, 4)))
    later = [p.decide(CREATIVE, IDLE).reason for _ in range(2000)]
    assert 0.03 * 2000 < later.count("explore") < 0.07 * 2000


def test_a_baseline_never_measured_is_explored_first() -> None:
    """CHAT goes speculative (predicted 1.4x faster) and the baseline's latency fit
    has seen nothing (its predictions are borrowed from the speculative route's
    fit): the budget explores the baseline well above the plain share, and is back
    at the plain share once the baseline has its own measurements."""
    p = CostModelPolicy(CostModelConfig(explore_share=0.05, seed=3, acceptance=MEASURED))
    first = [p.decide(CHAT, IDLE) for _ in range(40)]
    explored = [d for d in first if d.reason == "explore"]
    assert len(explored) >= 5 and all(d.route is BASE for d in explored)  # plain 5%: 2
    assert p.explore_counts()[0] <= 0.05 * 40 + 5  # the hard bound holds
    for _ in range(20):  # streamed: a prefill row and a decode row each
        p.observe(observation(BASE, CHAT, None))
    later = [p.decide(CHAT, IDLE).reason for _ in range(2000)]
    assert 0.03 * 2000 < later.count("explore") < 0.07 * 2000


def test_an_idle_moment_inside_bursts_does_not_explore_the_baseline_more() -> None:
    """Where most decisions find the GPU busy, an idle one is the start of a burst:
    a request explored there would start the batch on the route predicted slower.
    The baseline then gets the plain share only (40 idle decisions, each after 7
    busy ones: the plain 5% gives 2 on average, the boosted one 5 or more)."""
    p = CostModelPolicy(CostModelConfig(explore_share=0.05, seed=3, acceptance=MEASURED))
    busy = spec_state(inflight=1)
    idle = []
    for _ in range(40):
        for _ in range(7):
            p.decide(CHAT, busy)
        idle.append(p.decide(CHAT, IDLE).reason)
    assert idle.count("explore") <= 4


def test_no_exploration_when_the_other_route_is_far_slower() -> None:
    p = CostModelPolicy(CostModelConfig(explore_share=0.5, explore_max_slowdown=1.01))
    assert all(p.decide(STRUCTURED, IDLE).reason != "explore" for _ in range(500))


states = st.builds(
    LiveState,
    st.builds(
        BackendState,
        inflight=st.integers(0, 40),
        healthy=st.booleans(),
        running=st.none() | st.integers(0, 40),
        waiting=st.none() | st.integers(0, 10),
        kv_cache_usage=st.none() | st.floats(0, 1),
    ),
    st.builds(BackendState, inflight=st.integers(0, 40), healthy=st.booleans()),
)


@settings(max_examples=60, deadline=None, database=None)
@given(
    seq=st.lists(
        st.tuples(st.sampled_from([STRUCTURED, CREATIVE]), states), min_size=1, max_size=300
    ),
    share=st.floats(0.0, 0.5),
    seed=st.integers(0, 2**32),
)
def test_exploration_never_under_guards_and_never_past_its_share(
    seq: list[tuple[Any, LiveState]], share: float, seed: int
) -> None:
    cfg = CostModelConfig(explore_share=share, seed=seed)
    p = CostModelPolicy(cfg)
    explored = 0
    for n, (f, state) in enumerate(seq, start=1):
        d = p.decide(f, state)
        assert d.reason in COST_MODEL_REASONS
        if d.reason == "explore":
            explored += 1
            spec = state.speculative
            assert spec.healthy and state.baseline.healthy
            guards = GuardsConfig()
            assert spec.kv_cache_usage is None or spec.kv_cache_usage < guards.spec_max_kv_usage
            assert max(spec.inflight, spec.running or 0) < guards.spec_max_inflight
        assert explored <= share * n + 5


def test_same_seed_same_decisions() -> None:
    def run(seed: int) -> list[tuple[Route, str]]:
        p = CostModelPolicy(CostModelConfig(explore_share=0.2, seed=seed))
        return [(d.route, d.reason) for d in (p.decide(CHAT, IDLE) for _ in range(300))]

    assert run(7) == run(7)
    assert run(7) != run(8)


# ---- learning through observe --------------------------------------------------------


def observation(
    route: Route, f: Any, acceptance: float | None, duration: float = 2.0
) -> Observation:
    return Observation(
        route=route,
        features=f,
        batch=1,
        waiting=0,
        ttft_s=0.05,
        duration_s=duration,
        prompt_tokens=f.prompt_tokens,
        completion_tokens=200,
        acceptance=acceptance,
        predicted_s=1.0,
    )


def test_observe_changes_acceptance_and_reported_error() -> None:
    p = CostModelPolicy(CostModelConfig(acceptance=AcceptancePriors(creative=0.25)))
    assert p.decide(CREATIVE, IDLE).route is BASE
    for _ in range(200):  # this "creative" traffic turns out to be very predictable
        p.observe(observation(SPEC, CREATIVE, acceptance_rate(0.95, 4)))
    assert p.estimated_acceptance()[Workload.CREATIVE] == pytest.approx(0.95, abs=0.02)
    assert p.acceptance_samples()[Workload.CREATIVE] > 100
    assert p.prediction_error()[SPEC] == pytest.approx(0.5)
    assert BASE not in p.prediction_error()
    assert p.latency_parameters()[SPEC].samples > 100


def test_error_totals_separate_the_fit_from_the_length_guess() -> None:
    """CREATIVE states max_tokens 400; this answer stops at 200. The prediction as sent
    guessed 400 tokens; asked again with the true length, the untouched priors are
    what a request of 200 tokens at batch 1 predicts."""
    p = policy()
    guessed = p.predict(CREATIVE, IDLE)[BASE]
    true_length = p.predict(dataclasses.replace(CREATIVE, expected_output_tokens=200), IDLE)
    took = 1.5
    p.observe(dataclasses.replace(observation(BASE, CREATIVE, None, took), predicted_s=guessed))
    totals = p.error_totals()
    assert set(totals) == {BASE} and totals[BASE].count == 1
    assert totals[BASE].as_sent == pytest.approx(abs(guessed - took) / took)
    assert totals[BASE].given_length == pytest.approx(abs(true_length[BASE] - took) / took)
    assert totals[BASE].given_length != pytest.approx(totals[BASE].as_sent)
    p.error_totals()[BASE].count = 99  # a copy: the policy's sums are its own
    assert p.error_totals()[BASE].count == 1
    first = p.error_totals()[BASE]
    p.observe(dataclasses.replace(observation(BASE, CREATIVE, None, took), predicted_s=took))
    window = p.error_totals()[BASE].since(first)  # the second answer alone
    assert window.count == 1 and window.mape()[0] == pytest.approx(0.0)
    assert first.mape() == (totals[BASE].as_sent, totals[BASE].given_length)


def test_baseline_observations_never_touch_acceptance() -> None:
    p = policy()
    before = p.estimated_acceptance()
    for _ in range(50):
        p.observe(observation(BASE, STRUCTURED, None))
    assert p.estimated_acceptance() == before
    assert p.latency_parameters()[BASE].samples > 0


def test_odd_observations_are_ignored_or_survived() -> None:
    p = policy()
    p.observe(observation(SPEC, STRUCTURED, None, duration=0.0))
    p.observe(observation(SPEC, STRUCTURED, float("nan")))
    p.observe(
        dataclasses.replace(observation(SPEC, STRUCTURED, 0.5), completion_tokens=0, ttft_s=None)
    )
    d = p.decide(STRUCTURED, IDLE)
    assert d.predicted_s is not None and all(v > 0 for v in d.predicted_s.values())


@pytest.mark.parametrize(
    "bad",
    [
        {"explore_share": 0.9},
        {"explore_share": -0.1},
        {"num_speculative_tokens": 0},
        {"draft_cost_ratio": -1.0},
        {"explore_max_slowdown": 0.5},
    ],
)
def test_config_is_validated(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="cost model"):
        CostModelConfig(**bad)


def test_on_a_busy_shared_gpu_the_batch_stays_on_one_server() -> None:
    """Creative alone would go to baseline; with 5 requests on the speculative server
    and one GPU, waking the baseline would slow all of them: it joins them."""
    loaded = spec_state(inflight=5)
    d = policy().decide(CREATIVE, loaded)
    assert (d.route, d.reason) == (SPEC, "consolidate")
    d = policy(shared_gpu=False).decide(CREATIVE, loaded)  # two GPUs: its own best
    assert (d.route, d.reason) == (BASE, "baseline-predicted-faster")
    assert policy().decide(CREATIVE, IDLE).route is BASE  # an idle GPU: its own best


def test_a_long_prompt_prefilling_on_one_server_sends_the_next_request_to_the_other() -> None:
    p = policy(shared_gpu=False)  # a GPU each: the speculative one is idle
    assert p.decide(CREATIVE, IDLE).route is BASE
    prefilling = LiveState(BackendState(), BackendState(inflight=1, prefill_tokens=6000))
    d = p.decide(CREATIVE, prefilling)
    assert (d.route, d.reason) == (SPEC, "spec-predicted-faster")
    assert d.predicted_s is not None
    assert d.predicted_s[BASE] - p.predict(CREATIVE, spec_state())[BASE] > 1.0


def test_after_a_lull_the_ramp_does_not_follow_onto_a_server_the_load_will_rule_out() -> None:
    """The GPU ran 32 requests; after a lull the first one went to the speculative
    server alone. The ramp back to 32 stays on the baseline: speculative could take
    only 16 (spec_max_inflight) and would then hand its batch back."""
    p = policy()
    for _ in range(50):
        p.decide(CHAT, LiveState(BackendState(), BackendState(inflight=31)))
    d = p.decide(STRUCTURED, spec_state(inflight=1))
    assert (d.route, d.reason) == (BASE, "consolidate")
    fresh = policy()  # never under load: following the load is the cheap choice
    assert fresh.decide(STRUCTURED, spec_state(inflight=1)).route is SPEC


def test_no_exploration_while_the_shared_gpu_is_busy() -> None:
    p = policy(explore_share=0.5)
    loaded = LiveState(BackendState(inflight=3), BackendState())
    assert all(p.decide(CHAT, loaded).reason != "explore" for _ in range(200))
    assert any(p.decide(CHAT, IDLE).reason == "explore" for _ in range(200))
