"""What shadow copies teach: the cost model's paired observations and its exploration
knob (pure, no I/O), and `specroute advise` reading them from an outcome log."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from classifier.costmodel import CostModelConfig, CostModelPolicy
from classifier.features import Endpoint, RequestFeatures, Workload
from classifier.policy import BackendState, LiveState, Route
from gateway.cli import main
from gateway.config import ConfigError, parse_config
from gateway.state import SHADOWS
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.support import wait_until
from tooling.advise import load_shadows, render_shadows

IDLE = LiveState(BackendState(), BackendState())
COVER = 64


def chat(workload: Workload = Workload.CHAT) -> RequestFeatures:
    return RequestFeatures(
        Endpoint.CHAT, False, 0.7, None, 100, None, 128, False, 1, False, workload
    )


@dataclass(frozen=True)
class Answer:
    """A FinishedRequest: one answer as the gateway measured it."""

    route: Route
    features: RequestFeatures
    state: LiveState = IDLE
    ttft_s: float | None = None
    duration_s: float = 0.5
    prompt_tokens: int | None = 100
    completion_tokens: int = 128
    acceptance: float | None = None
    predicted_s: float | None = None
    pair: int = 0


def explored(policy: CostModelPolicy, f: RequestFeatures, n: int) -> int:
    return sum(policy.decide(f, IDLE).reason == "explore" for _ in range(n))


def test_a_workload_shadows_cover_is_explored_at_the_shadowed_share() -> None:
    config = CostModelConfig(explore_share=0.5, shadow_cover_decisions=COVER, seed=1)
    policy = CostModelPolicy(config)
    f = chat()
    assert explored(policy, f, 40) > 0  # not covered: users are explored
    policy.learn_shadow(Answer(Route.SPECULATIVE, f, acceptance=0.4))
    assert policy.shadow_covered(Workload.CHAT)
    assert not policy.shadow_covered(Workload.CODE)  # only the shadow's workload
    assert explored(policy, f, COVER) == 0
    assert not policy.shadow_covered(Workload.CHAT)  # the cover goes stale...
    assert explored(policy, f, 200) > 0  # ...and users are explored again


def test_a_shadow_teaches_as_an_answer_and_is_no_user_exploration() -> None:
    policy = CostModelPolicy(CostModelConfig(explore_share=0.0))
    f = chat(Workload.CREATIVE)
    before = policy.acceptance_samples().get(Workload.CREATIVE, 0.0)
    policy.learn_shadow(Answer(Route.SPECULATIVE, f, acceptance=0.1))
    policy.learn_shadow(Answer(Route.BASELINE, f))
    assert policy.acceptance_samples()[Workload.CREATIVE] > before
    fits = policy.latency_parameters()
    assert fits[Route.SPECULATIVE].samples > 0 and fits[Route.BASELINE].samples > 0
    assert policy.explore_counts() == (0, 0)


def test_without_cover_shadows_do_not_replace_exploration() -> None:
    config = CostModelConfig(explore_share=0.5, shadow_cover_decisions=0, seed=1)
    policy = CostModelPolicy(config)
    policy.learn_shadow(Answer(Route.SPECULATIVE, chat(), acceptance=0.4))
    assert not policy.shadow_covered(Workload.CHAT)
    assert explored(policy, chat(), 40) > 0


def test_the_knob_is_checked() -> None:
    backends = {"speculative": {"urls": ["http://a:1"]}, "baseline": {"urls": ["http://b:2"]}}
    routing = {"cost_model": {"shadow_cover_decisions": -1}}
    with pytest.raises(ConfigError, match="shadow_cover_decisions >= 0"):
        parse_config({"backends": backends, "routing": routing})


STRUCTURED = {
    "model": "m",
    "messages": [{"role": "user", "content": "Return it as JSON."}],
    "response_format": {"type": "json_object"},
    "temperature": 0.0,
}


async def test_advise_reads_the_shadows_from_the_outcome_log(
    gateway_for: GatewayFactory,
    base_upstream: FakeUpstream,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = tmp_path / "outcomes.jsonl"
    gateway = await gateway_for(shadow={"share": 1.0}, outcome_log={"path": str(log)})
    totals = gateway.app[SHADOWS].totals
    for i in range(3):
        await (await gateway.post("/v1/chat/completions", json=STRUCTURED)).read()
        await wait_until(lambda n=i + 1: len(base_upstream.received) == n, "the copy")
        await wait_until(lambda n=i + 1: totals.pairs.get("structured", 0) == n, "its pair")
    await gateway.close()
    shadows = load_shadows([log])
    assert len(shadows) == 3 and all(s["outcome"] == "completed" for s in shadows)
    assert all("prompt" not in s and "messages" not in json.dumps(s) for s in shadows)
    lines = render_shadows(shadows)
    row = next(line for line in lines if line.startswith("structured"))
    assert row.split()[1:6] == ["3", "3", "0", "0", "3"]
    # The same pairs give the log's reader the gateway's live speedup (to the log's rounding).
    live = totals.speedup("structured")
    assert live is not None
    assert float(row.split()[6].removesuffix("x")) == pytest.approx(live, abs=0.006)
    capsys.readouterr()
    assert main(["advise", str(log), "--k", "4"]) == 0
    out = capsys.readouterr().out
    assert "live side-by-side, from shadow copies" in out and "(3 records)" in out
