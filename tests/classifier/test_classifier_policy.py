"""RulesPolicy: every rule, its reason, and the order the rules apply in."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from classifier import (
    BackendState,
    Decision,
    Endpoint,
    FeatureOptions,
    GuardsConfig,
    LiveState,
    Policy,
    RequestFeatures,
    Route,
    RulesConfig,
    RulesPolicy,
    StaticPolicy,
    TokenCounter,
    Workload,
    extract_features,
)
from classifier.guards import DEFAULT_GUARDS
from classifier.types import PAIR

SPEC, BASE = Route.SPECULATIVE, Route.BASELINE
IDLE = LiveState.pair(BackendState(), BackendState())
POLICY = RulesPolicy(RulesConfig())


def features(**overrides: Any) -> RequestFeatures:
    """A short, plain chat request at temperature 0.7; override what the test is about."""
    base: dict[str, Any] = {
        "endpoint": Endpoint.CHAT,
        "structured": False,
        "temperature": 0.7,
        "top_p": None,
        "prompt_tokens": 100,
        "max_tokens": None,
        "expected_output_tokens": 256,
        "stream": False,
        "n": 1,
        "code_like": False,
        "workload": Workload.CHAT,
    }
    return RequestFeatures(**{**base, **overrides})


def spec_state(**fields: Any) -> LiveState:
    return LiveState.pair(BackendState(**fields), BackendState())


def decide(
    f: RequestFeatures,
    state: LiveState = IDLE,
    guards: GuardsConfig = DEFAULT_GUARDS,
    **config: Any,
) -> tuple[Route, str]:
    d = RulesPolicy(RulesConfig(**config), guards=guards).decide(f, state)
    return d.route, d.reason


# --- each rule -----------------------------------------------------------------------


def test_default() -> None:
    assert decide(features()) == (SPEC, "default")
    assert decide(features(), default_route=BASE) == (BASE, "default")


@pytest.mark.parametrize("usage", [0.9, 0.95, 1.0])
def test_kv_pressure(usage: float) -> None:
    assert decide(features(), spec_state(kv_cache_usage=usage)) == (BASE, "kv-pressure")


def test_kv_below_threshold_or_unknown() -> None:
    assert decide(features(), spec_state(kv_cache_usage=0.89)) == (SPEC, "default")
    assert decide(features(), spec_state(kv_cache_usage=None)) == (SPEC, "default")


def test_spec_busy_by_gateway_count_or_scraped_running() -> None:
    assert decide(features(), spec_state(inflight=16)) == (BASE, "spec-busy")
    assert decide(features(), spec_state(inflight=2, running=17)) == (BASE, "spec-busy")
    assert decide(features(), spec_state(inflight=15, running=3)) == (SPEC, "default")
    four = GuardsConfig(spec_max_inflight=4)
    assert decide(features(), spec_state(inflight=3), four) == (SPEC, "default")
    assert decide(features(), spec_state(inflight=4), four) == (BASE, "spec-busy")


def test_baseline_load_does_not_matter_to_the_rules() -> None:
    state = LiveState.pair(BackendState(), BackendState(inflight=100, kv_cache_usage=0.99))
    assert decide(features(), state) == (SPEC, "default")


def test_high_temperature() -> None:
    assert decide(features(temperature=1.2, workload=Workload.CREATIVE)) == (
        BASE,
        "high-temperature",
    )
    # above the threshold whatever the workload, e.g. code sampled hot
    assert decide(features(temperature=1.5, code_like=True, workload=Workload.CODE)) == (
        BASE,
        "high-temperature",
    )
    # explicit temperature 1.0 is creative (see extract_features)
    assert decide(features(temperature=1.0, workload=Workload.CREATIVE)) == (
        BASE,
        "high-temperature",
    )


def test_inherited_default_temperature_is_not_high() -> None:
    assert decide(features(temperature=1.0, workload=Workload.CHAT)) == (SPEC, "default")


def test_high_temperature_uses_the_features_threshold() -> None:
    """The rules' "sampling above it" is the same threshold extract_features used."""
    hot_code = features(temperature=1.2, code_like=True, workload=Workload.CODE)
    assert decide(hot_code) == (BASE, "high-temperature")
    cooler = RulesPolicy(RulesConfig(), features=FeatureOptions(creative_min_temperature=1.5))
    assert cooler.decide(hot_code, IDLE).reason == "default"


def test_prefill_bound() -> None:
    assert decide(features(prompt_tokens=2049, expected_output_tokens=256)) == (
        BASE,
        "prefill-bound",
    )
    assert decide(features(prompt_tokens=2048, expected_output_tokens=256)) == (SPEC, "default")
    assert decide(features(prompt_tokens=9, expected_output_tokens=0)) == (BASE, "prefill-bound")
    assert decide(features(prompt_tokens=5000, expected_output_tokens=256), prefill_ratio=20) == (
        SPEC,
        "default",
    )


def test_structured_low_temp() -> None:
    structured = {"structured": True, "workload": Workload.STRUCTURED}
    assert decide(features(temperature=0.0, **structured)) == (SPEC, "structured-low-temp")
    assert decide(features(temperature=0.3, **structured)) == (SPEC, "structured-low-temp")
    assert decide(features(temperature=0.5, **structured)) == (SPEC, "default")
    assert decide(features(temperature=0.5, **structured), default_route=BASE) == (BASE, "default")


def test_code_low_temp() -> None:
    code = {"code_like": True, "workload": Workload.CODE}
    assert decide(features(temperature=0.2, **code), default_route=BASE) == (SPEC, "code-low-temp")
    assert decide(features(temperature=0.8, **code), default_route=BASE) == (BASE, "default")


@pytest.mark.parametrize("rules_route", [SPEC, BASE])
def test_unhealthy_fallback(rules_route: Route) -> None:
    f = features() if rules_route == SPEC else features(temperature=1.5)
    down = BackendState(healthy=False)
    state = (
        LiveState.pair(down, BackendState())
        if rules_route == SPEC
        else LiveState.pair(BackendState(), down)
    )
    d = POLICY.decide(f, state)
    assert (d.route, d.reason) == (BASE if rules_route == SPEC else SPEC, "unhealthy-fallback")


def test_fallback_wins_over_load_rules() -> None:
    state = LiveState.pair(BackendState(kv_cache_usage=0.99), BackendState(healthy=False))
    assert decide(features(), state) == (SPEC, "unhealthy-fallback")


def test_both_unhealthy_keeps_the_rules_choice() -> None:
    state = LiveState.pair(BackendState(healthy=False), BackendState(healthy=False))
    assert decide(features(), state) == (SPEC, "default")


def test_unhealthy_other_backend_changes_nothing() -> None:
    state = LiveState.pair(BackendState(), BackendState(healthy=False))
    assert decide(features(structured=True, temperature=0.0), state) == (
        SPEC,
        "structured-low-temp",
    )


# --- order ------------------------------------------------------------------------------


def test_load_rules_come_first() -> None:
    hot = features(temperature=1.5, workload=Workload.CREATIVE, prompt_tokens=9000)
    assert decide(hot, spec_state(kv_cache_usage=0.95, inflight=50)) == (BASE, "kv-pressure")
    assert decide(hot, spec_state(inflight=50)) == (BASE, "spec-busy")
    assert decide(hot) == (BASE, "high-temperature")


def test_prefill_bound_beats_structured() -> None:
    f = features(
        structured=True,
        temperature=0.0,
        prompt_tokens=6000,
        max_tokens=16,
        expected_output_tokens=16,
        workload=Workload.STRUCTURED,
    )
    assert decide(f) == (BASE, "prefill-bound")


# --- end to end from request bodies (the brief's scenarios) --------------------------------


def body_decision(counter: TokenCounter, body: dict[str, Any]) -> tuple[Route, str]:
    f = extract_features(body, Endpoint.CHAT, counter)
    d = POLICY.decide(f, IDLE)
    return d.route, d.reason


def test_scenarios(counter: TokenCounter) -> None:
    long_doc = "The committee reviewed the quarterly figures in detail. " * 600
    schema = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}

    def msg(text: str, **fields: Any) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": text}], **fields}

    assert body_decision(
        counter, msg(long_doc, temperature=0, max_tokens=16, response_format=schema)
    ) == (BASE, "prefill-bound")
    assert body_decision(
        counter, msg("Extract the name: Ada, 36", temperature=0, response_format=schema)
    ) == (
        SPEC,
        "structured-low-temp",
    )
    assert body_decision(counter, msg("Write a poem about the sea", temperature=1.2)) == (
        BASE,
        "high-temperature",
    )
    assert body_decision(counter, msg(long_doc, max_tokens=16)) == (BASE, "prefill-bound")
    assert body_decision(counter, msg("SELECT * FROM t -- optimise", temperature=0)) == (
        SPEC,
        "code-low-temp",
    )
    assert body_decision(counter, msg("How are you?")) == (SPEC, "default")


# --- the small types -----------------------------------------------------------------------


def test_static_policy() -> None:
    for route in PAIR:
        d = StaticPolicy(route).decide(features(temperature=2.0), spec_state(healthy=False))
        assert (d.route, d.reason) == (route, "static")


def test_policies_satisfy_the_protocol() -> None:
    policies: list[Policy] = [RulesPolicy(RulesConfig()), StaticPolicy(BASE)]
    assert all(isinstance(p.decide(features(), IDLE), Decision) for p in policies)
    for p in policies:  # neither learns: learn is a no-op, and there is no estimate
        assert p.estimated_acceptance() == {}


def test_decisions_are_deterministic() -> None:
    f = features(structured=True, temperature=0.1)
    assert len({POLICY.decide(f, IDLE) for _ in range(5)}) == 1


def test_live_state_of_and_route_values() -> None:
    spec, base = BackendState(inflight=1), BackendState(inflight=2)
    state = LiveState.pair(spec, base)
    assert state.of(SPEC) is spec and state.of(BASE) is base
    assert [r.value for r in PAIR] == ["speculative", "baseline"]


def test_defaults_and_frozen() -> None:
    assert BackendState() == BackendState(0, True, None, None, None)
    assert Decision(SPEC, "default").predicted_s is None
    assert RulesConfig().default_route is None  # the first speculative route configured
    with pytest.raises(dataclasses.FrozenInstanceError):
        RulesConfig().prefill_ratio = 2.0  # type: ignore[misc]
