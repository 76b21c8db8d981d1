"""local_stack's topologies: one GPU shared by both emulated servers (as deployed), or one each."""

from __future__ import annotations

import pytest

from tooling.emulator import EmulatorConfig
from tooling.local_stack import MODEL, gateway_config, local_stack

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
