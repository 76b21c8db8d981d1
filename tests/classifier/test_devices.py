"""Which routes share a device ([routes.NAME] device): a busy route slows only its own
device's neighbours, and a busy time-sliced device's batch stays on its carrier while a
route on another device is free capacity (classifier/router.py, classifier/profile.py).

The trio is the real CPU tier's placement (deploy/cpu/up.sh --ngram-k2): ngram-k4 alone
on core 0; none and ngram-k2 time-sliced on core 1. Its costs are CPU-like: a step of two
sequences 1.5x a step of one, ngram-k2 a little cheaper per token than ngram-k4.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from classifier.cost import price, prior_profile
from classifier.features import Workload
from classifier.profile import Curve, EngineProfile, RouteProfile, ServerIdentity
from classifier.router import ProfiledPolicy, RouterConfig
from classifier.types import BackendState, LiveState, Route, RouteSpec
from tests.classifier.test_router import feats

NONE, K4, K2 = Route("none"), Route("ngram-k4"), Route("ngram-k2")
DEVICES = {NONE: "core1", K4: "core0", K2: "core1"}
BESIDE = {NONE: 2.0, K4: 1.0, K2: 2.0}  # as measured against a neighbour of its device
BATCHES = (1.0, 2.0, 4.0)
STEPS = {NONE: (0.050, 0.075, 0.125), K4: (0.065, 0.100, 0.160), K2: (0.060, 0.090, 0.150)}
K = {NONE: 0, K4: 4, K2: 2}
TOKENS_PER_STEP = {K4: 1.6, K2: 1.5}  # chat: 0.0406 and 0.0400 s a token, none 0.050


def trio(devices: dict[Route, str]) -> EngineProfile:
    def route(r: Route) -> RouteProfile:
        identity = ServerIdentity(
            f"http://{r}", "m", "0.32.0", "ngram" if K[r] else "none", K[r], device=devices[r]
        )
        tps = {Workload.CHAT: (TOKENS_PER_STEP[r], 40)} if r in TOKENS_PER_STEP else {}
        ttft = Curve((10.0, 1000.0), (0.05, 0.5))
        return RouteProfile(r.value, identity, ttft, Curve(BATCHES, STEPS[r]), tps, BESIDE[r])

    return EngineProfile(
        tuple(route(r) for r in (NONE, K4, K2)), "2026-12-05T00:00:00+00:00", 9.0, "measured"
    )


def policy(p: EngineProfile) -> ProfiledPolicy:
    routes = [RouteSpec(NONE), RouteSpec(K4, 4, "ngram"), RouteSpec(K2, 2, "ngram")]
    return ProfiledPolicy(RouterConfig(), routes=routes, profile=p)


CHAT = feats(Workload.CHAT, out=64)


def state(busy: Route | None) -> LiveState:
    return LiveState(
        {
            r: BackendState(inflight=1, mix=((Workload.CHAT, 1),), last_start=1)
            if r == busy
            else BackendState()
            for r in (NONE, K4, K2)
        }
    )


def test_the_profile_groups_routes_by_device_and_none_said_is_one() -> None:
    split = trio(DEVICES)
    assert split.devices() == (("none", "ngram-k2"), ("ngram-k4",))
    assert split.neighbours("none") == ("ngram-k2",)
    assert split.neighbours("ngram-k4") == ()
    assert split.shared(("none", "ngram-k2")) and not split.shared(("ngram-k4",))
    assert EngineProfile.loads(split.dumps()).to_json() == split.to_json()
    one = trio(dict.fromkeys(DEVICES, ""))
    assert one.devices() == (("none", "ngram-k4", "ngram-k2"),)
    assert one.neighbours("ngram-k4") == ("none", "ngram-k2")
    assert "device" not in one.to_json()["routes"][0]["identity"]  # /2 files as before


def test_a_busy_neighbour_slows_only_the_routes_of_its_device() -> None:
    split = policy(trio(DEVICES))
    idle, busy = split.predict(CHAT, state(None)), split.predict(CHAT, state(K2))
    assert busy[K4] == pytest.approx(idle[K4])  # core 0: nobody beside it
    assert busy[NONE] > 1.8 * idle[NONE] - 0.06  # core 1: time-sliced with ngram-k2
    assert split.predict(CHAT, state(K4))[NONE] == pytest.approx(idle[NONE])  # core 0 busy
    one = policy(trio(dict.fromkeys(DEVICES, "")).with_beside(2.0))  # measured beside any
    assert one.predict(CHAT, state(K2))[K4] > idle[K4]  # not told: one device for all


def test_a_busy_neighbour_slows_the_first_token_only_on_its_device() -> None:
    # A prefill is a step too: beside a busy neighbour of its device it takes the same
    # share as a decode step (the emulator's SharedGpu); a busy route on another device
    # leaves it alone. Unslowed, an idle neighbour of the batch looked faster to a TTFT
    # target than it was (benchmarks/slo.py, one GPU, without the regret bound).
    split = trio(DEVICES)
    learned = policy(split)._learned()

    def first(busy: Route | None, route: Route) -> float:
        return price(split, CHAT, state(busy), route, 0.0, learned).first_token_s

    alone, none = first(None, NONE), split.route(NONE.value)
    assert none is not None and alone == pytest.approx(none.ttft.at(100.0))
    assert first(K2, NONE) == pytest.approx(BESIDE[NONE] * alone)  # core 1: time-sliced
    assert first(K4, NONE) == pytest.approx(alone)  # the busy one is on core 0
    assert first(K2, K4) == pytest.approx(first(None, K4))  # core 0: nobody beside it


def test_a_failed_answer_is_priced_as_retried_at_the_neighbours_share() -> None:
    # ngram-k4 (core 0) fails half its answers; the retry elsewhere is on core 1, where
    # none is busy: ngram-k2 idle beside it runs at half speed (0.08 s a token, not
    # 0.04), so none's own batch of two (0.075 s a token) is the cheaper retry.
    split = trio(DEVICES)
    learned = policy(split)._learned()
    out = learned.outputs.predict(CHAT) - 1.0

    def cost(failing: float) -> float:
        fails = replace(learned, failure=lambda r, w: failing if r == K4 else 0.0)
        return price(split, CHAT, state(NONE), K4, 0.0, fails).cost_s

    def time(route: Route, batch: float, slowdown: float) -> float:
        rp = split.route(route.value)
        assert rp is not None
        tau = 1.0 + rp.identity.num_speculative_tokens * learned.rate(route, CHAT)
        return (rp.ttft.at(100.0) + out / tau * rp.step.at(batch)) * slowdown

    assert time(K2, 1.0, 1.0) < time(NONE, 2.0, 1.0) < time(K2, 1.0, BESIDE[K2])
    assert (cost(0.5) - cost(0.0)) / 0.5 == pytest.approx(time(NONE, 2.0, 1.0))


def test_a_second_request_goes_to_the_free_device_not_beside_the_busy_one() -> None:
    # Idle, the cheapest per token: ngram-k2. With it busy, on one device (nothing said)
    # the batch stays on its carrier; told that ngram-k4 has a core of its own, the
    # second request runs there, alone, instead of in ngram-k2's batch or beside it.
    split = policy(trio(DEVICES))
    one = policy(trio(dict.fromkeys(DEVICES, "")).with_beside(2.0))
    assert split.decide(CHAT, state(None)).route == K2
    held = one.decide(CHAT, state(K2))
    assert held.route == K2 and held.why is not None and "followers_s" in held.why
    spread = split.decide(CHAT, state(K2))
    assert spread.route == K4 and spread.why is not None
    assert spread.why["rule"] == "smaller-cost"
    shared = spread.why["followers_s"]
    assert isinstance(shared, dict) and K4.value not in shared  # alone on its core
    # ngram-k4 busy instead: core 1's carrier (ngram-k2, the cheaper) takes it.
    assert split.decide(CHAT, state(K4)).route == K2


def test_routes_on_one_device_still_consolidate_when_another_device_exists() -> None:
    # Both core-1 routes idle but the traffic usually holds two requests: core 1 offers
    # one carrier, core 0 itself; with ngram-k4 made dear, the carrier is sent.
    dear = trio(DEVICES)
    k4 = dear.route("ngram-k4")
    assert k4 is not None
    dear = replace(
        dear,
        routes=tuple(
            replace(r, step=Curve(r.step.xs, tuple(3.0 * y for y in r.step.ys)))
            if r.name == "ngram-k4"
            else r
            for r in dear.routes
        ),
    )
    decision = policy(dear).decide(CHAT, state(NONE))
    assert decision.route in (NONE, K2) and decision.reason == "consolidate"


def test_on_the_built_in_prior_the_configured_devices_count() -> None:
    # Before the profile is in, the prior said one shared GPU whatever the operator had
    # configured: the chaos run's two emulated servers (a GPU each) were priced as
    # time-sliced, and a probe joined the baseline's batch of 23 while the speculative
    # server ran 4 (4.1x its unloaded first token).
    routes = [RouteSpec(NONE, device="core1"), RouteSpec(K4, 4, "ngram", device="core0")]
    assert prior_profile(routes).devices() == (("none",), ("ngram-k4",))
    one = [replace(r, device="") for r in routes]
    assert prior_profile(one).devices() == (("none", "ngram-k4"),)
    busy = LiveState(
        {NONE: BackendState(inflight=20, mix=((Workload.CHAT, 20),)), K4: BackendState()}
    )
    split = ProfiledPolicy(RouterConfig(), routes=routes).decide(CHAT, busy)
    assert split.reason == "unprofiled" and split.why is not None
    assert not split.why.get("followers_s")
    shared = ProfiledPolicy(RouterConfig(), routes=one).decide(CHAT, busy)
    assert shared.why is not None and shared.why.get("followers_s")
