"""Four routes on two GPUs, told their devices or not ([routes.NAME] device), in virtual time
on the measured H200 (tooling/sim/shared_gpu.py devices=: each GPU time-sliced among its
own busy servers). Told, the router keeps one carrier per busy GPU and uses both; not
told (one device for all, beside 2 everywhere: the gateway without `device`), it
consolidates the batch on one server and leaves the other GPU idle. And the sim's
devices= must agree with what gpus= always meant: one device for all is one GPU, a device
each is a GPU each.

The full table: .venv/bin/python benchmarks/devices.py
"""

from __future__ import annotations

import pytest

from classifier import Route, StaticPolicy
from tooling.sim.shared_gpu import (
    FOUR_ROUTES,
    engine_profile,
    jobs,
    mean_latency,
    profiled,
    simulate,
)

# Round-robin over two GPUs, as deploy/gpu/routes.py places them.
TWO_GPUS = {r.name: f"gpu{i % 2}" for i, r in enumerate(FOUR_ROUTES)}
ONE = dict.fromkeys(TWO_GPUS, "gpu0")
EACH = {r: f"gpu{i}" for i, r in enumerate(TWO_GPUS)}
REQUESTS = jobs(10, seed=7)


def test_told_the_devices_the_router_uses_both_gpus_and_is_faster() -> None:
    """Measured in this sim (c=16, 60 requests): told 0.83x not told and 0.76x the best static
    route, not told 0.91x; told sends 27 to eagle3-k3 (gpu1) and 33 to eagle3-k7 (gpu0),
    not told 50 and 10 (it believes they share a GPU, so the batch mostly stays on one)."""
    told = simulate(
        profiled(routes=FOUR_ROUTES, devices=TWO_GPUS),
        REQUESTS,
        16,
        routes=FOUR_ROUTES,
        devices=TWO_GPUS,
        seed=7,
    )
    blind = simulate(
        profiled(routes=FOUR_ROUTES), REQUESTS, 16, routes=FOUR_ROUTES, devices=TWO_GPUS, seed=7
    )
    assert {TWO_GPUS[s.route] for s in told} == {"gpu0", "gpu1"}
    assert mean_latency(told) < 0.85 * mean_latency(blind)
    best = min(
        mean_latency(simulate(StaticPolicy(r.name), REQUESTS, 16, routes=FOUR_ROUTES))
        for r in FOUR_ROUTES
    )
    assert mean_latency(told) < 0.9 * best


def test_the_profile_says_each_routes_device_and_its_neighbours() -> None:
    told = engine_profile(routes=FOUR_ROUTES, devices=TWO_GPUS)
    assert [r.identity.device for r in told.routes] == ["gpu0", "gpu1", "gpu0", "gpu1"]
    assert told.devices() == (("none", "eagle3-k7"), ("eagle3-k3", "ngram-k8"))
    assert [r.beside for r in told.routes] == [2.0] * 4
    alone = engine_profile(routes=FOUR_ROUTES, devices=EACH)
    assert [r.beside for r in alone.routes] == [1.0] * 4
    assert not alone.shared_gpu
    blind = engine_profile(routes=FOUR_ROUTES)
    assert {r.identity.device for r in blind.routes} == {""}
    assert [r.beside for r in blind.routes] == [2.0] * 4


@pytest.mark.parametrize(("devices", "gpus"), [(ONE, 1), (EACH, 2)])
def test_devices_one_for_all_or_each_its_own_is_gpus_1_or_2(
    devices: dict[Route, str], gpus: int
) -> None:
    """The same decisions and, to rounding, the same times as gpus= (without devices the
    sim is the one before devices=)."""
    for c in (1, 8):
        old = simulate(
            profiled(routes=FOUR_ROUTES, gpus=gpus), REQUESTS, c, routes=FOUR_ROUTES, gpus=gpus
        )
        told = profiled(routes=FOUR_ROUTES, devices=devices)
        new = simulate(told, REQUESTS, c, routes=FOUR_ROUTES, devices=devices)
        assert [s.route for s in new] == [s.route for s in old]
        assert [s.duration_s for s in new] == pytest.approx([s.duration_s for s in old], rel=1e-9)


def test_devices_must_name_every_route_and_not_come_with_gpus() -> None:
    partial = {r: d for r, d in TWO_GPUS.items() if r != Route("none")}
    with pytest.raises(ValueError, match="devices"):
        simulate(StaticPolicy(Route("none")), REQUESTS, 1, routes=FOUR_ROUTES, devices=partial)
    with pytest.raises(ValueError, match="not both"):
        engine_profile(routes=FOUR_ROUTES, devices=TWO_GPUS, gpus=2)
