"""[routing.guards]: one table, one default, and every policy the config builds obeys it
(the rules and the earlier cost model each had their own copy, 8 and 16)."""

from __future__ import annotations

import pytest

from classifier import BackendState, LiveState, Workload
from classifier.features import Endpoint, RequestFeatures
from gateway.config import parse_config
from gateway.runtime import build_policy

BACKENDS = {"speculative": {"urls": ["http://a:1"]}, "baseline": {"urls": ["http://b:2"]}}
POLICIES = ("rules", "profiled")
STRUCTURED = RequestFeatures(
    endpoint=Endpoint.CHAT,
    structured=True,
    temperature=0.0,
    top_p=None,
    prompt_tokens=300,
    max_tokens=256,
    expected_output_tokens=256,
    stream=True,
    n=1,
    code_like=False,
    workload=Workload.STRUCTURED,
)


def reason(
    policy: str, spec: BackendState, base: BackendState | None = None, **guards: object
) -> str:
    routing = {"policy": policy, "guards": guards}
    built = build_policy(parse_config({"backends": BACKENDS, "routing": routing}))
    return built.decide(STRUCTURED, LiveState.pair(spec, base or BackendState())).reason


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("base_running", [33, 34, 60])
def test_a_busy_speculative_server_is_not_spared_for_a_busier_one(
    policy: str, base_running: int
) -> None:
    """The chaos run's failure: speculative 33 running, baseline 34, and the guard sent
    the probe to the baseline, where it waited 2.8x its unloaded time."""
    spec = BackendState(running=33, waiting=0, others=33)
    base = BackendState(running=base_running, waiting=0, others=base_running)
    assert reason(policy, spec, base) != "spec-busy"
    assert reason(policy, spec, BackendState(running=32, others=32)) == "spec-busy"


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_has_the_same_default_guards(policy: str) -> None:
    assert reason(policy, BackendState(inflight=16)) == "spec-busy"
    assert reason(policy, BackendState(inflight=2, running=16)) == "spec-busy"
    assert reason(policy, BackendState(inflight=15)) != "spec-busy"
    assert reason(policy, BackendState(kv_cache_usage=0.9)) == "kv-pressure"
    assert reason(policy, BackendState(kv_cache_usage=0.89)) != "kv-pressure"


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_reads_the_guards_table(policy: str) -> None:
    assert reason(policy, BackendState(inflight=4), spec_max_inflight=4) == "spec-busy"
    assert reason(policy, BackendState(inflight=3), spec_max_inflight=4) != "spec-busy"
    assert reason(policy, BackendState(kv_cache_usage=0.5), spec_max_kv_usage=0.5) == "kv-pressure"
