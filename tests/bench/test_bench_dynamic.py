"""The emulated stack's dynamic server (local_stack with_dynamic) and the bench's flags for it."""

from __future__ import annotations

import argparse

import aiohttp
import pytest

from classifier.tokens import TokenCounter
from tooling.bench.cli import add_arguments, options
from tooling.local_stack import local_stack


async def test_the_dynamic_server_is_its_own_and_not_behind_the_gateway(
    tokens: TokenCounter,
) -> None:
    schedule = ((1, 2, 4), (3, 256, 0))
    async with (
        local_stack(
            time_scale=0.05, tokens=tokens, with_dynamic=True, dynamic_schedule=schedule
        ) as stack,
        aiohttp.ClientSession() as session,
    ):
        assert stack.dynamic is not None and stack.dynamic_emulator is not None
        assert stack.dynamic not in (stack.speculative, stack.baseline, stack.gateway)
        async with session.get(f"{stack.dynamic}/emulator/state") as resp:
            state = await resp.json()
        assert state["mode"] == "dynamic"
        assert state["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 256, 0]]
        # Same model and knobs as the speculative server the gateway is told about.
        assert stack.dynamic_emulator.model == stack.emulator.model
        assert (
            stack.dynamic_emulator.num_speculative_tokens == stack.emulator.num_speculative_tokens
        )
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        async with session.post(f"{stack.dynamic}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
        # The gateway fronts the pair only: a read it passes on reaches one of the two.
        async with session.get(f"{stack.gateway}/emulator/state") as resp:
            assert resp.status == 200
            assert (await resp.json())["mode"] != "dynamic"
    async with local_stack(time_scale=0.05, tokens=tokens) as plain:
        assert plain.dynamic is None and plain.dynamic_emulator is None
    with pytest.raises(ValueError, match="needs with_dynamic"):
        async with local_stack(dynamic_schedule=schedule):
            pass


def test_the_bench_takes_the_schedule_as_vllm_does(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--emulate", "--with-dynamic", "--dynamic-schedule", "[[5, 8, 2], [1, 4, 4]]"]
    args = parser.parse_args(argv)
    assert args.dynamic_schedule == ((1, 4, 4), (5, 8, 2))
    options(args, argv)  # accepted
    with pytest.raises(SystemExit):
        parser.parse_args(["--emulate", "--with-dynamic", "--dynamic-schedule", "[[1, 4]]"])
    assert "3-item sequence" in capsys.readouterr().err
