"""local_stack's topologies: one GPU shared by both emulated servers (as deployed), or one each."""

from __future__ import annotations

import pytest

from classifier.types import Route
from tooling.emulator import EmulatorConfig
from tooling.local_stack import (
    MODEL,
    EmulatedRoute,
    gateway_config,
    local_stack,
    pair_members,
    routes_config,
    routes_stack,
)

EMULATOR = EmulatorConfig(mode="speculative", model=MODEL)


def test_the_gateway_is_not_told_the_topology() -> None:
    """It measures whether the two servers share a GPU (the profile's beside ratios):
    local_stack passes the routing table through and adds nothing to it."""
    config = gateway_config("http://s", "http://b", EMULATOR, routing={"policy": "rules"})
    assert config.routing.policy == "rules"
    assert config.routing.tuning == gateway_config("http://s", "http://b", EMULATOR).routing.tuning


async def test_only_one_or_two_gpus() -> None:
    with pytest.raises(ValueError, match="gpus is 1 or 2"):
        async with local_stack(gpus=3):
            pass


def test_emulated_routes_are_named_and_configured_as_their_servers_run() -> None:
    routes = [EmulatedRoute.parse(t) for t in ("none", "eagle3:3", "ngram:8")]
    assert [r.name for r in routes] == ["none", "eagle3-k3", "ngram-k8"]
    plain = EmulatorConfig(mode="baseline", model=MODEL)
    emulators = {r.name: r.emulator(plain) for r in routes}
    assert emulators["none"] is plain
    assert emulators["eagle3-k3"].drafter == "eagle3"
    assert emulators["ngram-k8"].num_speculative_tokens == 8
    config = routes_config(routes, {r.name: f"http://{r.name}" for r in routes}, emulators)
    assert list(config.routes) == ["none", "eagle3-k3", "ngram-k8"]
    assert config.routes[Route("eagle3-k3")].method == "eagle3"
    assert config.routes[Route("ngram-k8")].num_speculative_tokens == 8
    assert config.routes[Route("none")].speculative is False
    with pytest.raises(ValueError, match="DRAFTER:K"):
        EmulatedRoute.parse("eagle3:0")


async def test_routes_stack_wants_a_plain_route() -> None:
    with pytest.raises(ValueError, match="one route must be none"):
        async with routes_stack([EmulatedRoute("eagle3", 3), EmulatedRoute("ngram", 4)]):
            pass


def test_a_two_route_gateway_is_the_plain_route_and_one_other_or_any_two() -> None:
    assert pair_members("eagle3-k3", "none") == ("none", "eagle3-k3")
    assert pair_members("eagle3-k3+eagle3-k7", "none") == ("eagle3-k3", "eagle3-k7")


def test_a_dynamic_emulated_route_runs_and_configures_its_schedule() -> None:
    """DRAFTER:K@SCHEDULE (vLLM's JSON) or @dynamic (the emulator's, K at most K): its
    server in dynamic mode, its [routes.NAME] with the same num_speculative_tokens_per_batch_size."""
    from tooling.bench.cli import emulated_routes

    routes = emulated_routes("none,eagle3:4@[[1,4,4],[5,16,2],[17,256,0]],draft-1b:2@dynamic")
    assert [r.name for r in routes] == ["none", "eagle3-k4-dynamic", "draft-1b-k2-dynamic"]
    assert routes[1].schedule == ((1, 4, 4), (5, 16, 2), (17, 256, 0))
    assert max(e[2] for e in routes[2].schedule) == 2
    plain = EmulatorConfig(mode="baseline", model=MODEL)
    emulators = {r.name: r.emulator(plain) for r in routes}
    assert emulators["eagle3-k4-dynamic"].mode == "dynamic"
    assert emulators["eagle3-k4-dynamic"].k_by_batch_size()[4:6] == [4, 2]
    config = routes_config(routes, {r.name: f"http://{r.name}" for r in routes}, emulators)
    spec = config.route_specs[1]
    assert spec.k == 4 and spec.k_by_batch == routes[1].schedule
    with pytest.raises(ValueError, match="at most 2"):
        EmulatedRoute.parse("eagle3:2@[[1,4,4]]")
