"""[routing.guards]: one table, one default, and every policy the config builds obeys it
(the rules and the cost model each had their own copy, 8 and 16)."""

from __future__ import annotations

import pytest

from classifier import BackendState, LiveState, Route, Workload
from classifier.features import Endpoint, RequestFeatures
from gateway.config import parse_config
from gateway.runtime import build_policy

BACKENDS = {"speculative": {"urls": ["http://a:1"]}, "baseline": {"urls": ["http://b:2"]}}
POLICIES = ("rules", "cost-model", "profiled")
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


def reason(policy: str, spec: BackendState, **guards: object) -> str:
    routing = {"policy": policy, "guards": guards, "cost_model": {"explore_share": 0.0}}
    built = build_policy(parse_config({"backends": BACKENDS, "routing": routing}))
    return built.decide(STRUCTURED, LiveState(spec, BackendState())).reason


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


@pytest.mark.parametrize(("limit", "carrier"), [(4, Route.BASELINE), (16, Route.SPECULATIVE)])
def test_the_busy_gpus_carrier_respects_the_guard(limit: int, carrier: Route) -> None:
    """The cost model also sizes its one-GPU carrier by spec_max_inflight: after a
    stretch of 8 in flight, the speculative server is a carrier only if the guard
    would let it hold 8."""
    routing = {
        "policy": "cost-model",
        "guards": {"spec_max_inflight": limit},
        "cost_model": {"explore_share": 0.0},
    }
    policy = build_policy(parse_config({"backends": BACKENDS, "routing": routing}))
    for _ in range(50):
        policy.decide(STRUCTURED, LiveState(BackendState(), BackendState(inflight=7)))
    after_lull = LiveState(BackendState(inflight=1), BackendState())
    assert policy.decide(STRUCTURED, after_lull).route is carrier
