"""A dynamic-speculation route beside a plain one, end to end: `serve --emulate --config`
runs its server in the emulator's dynamic mode with the file's schedule, the gateway
routes to it, and /decide's why says the K the batch it would join gives."""

from __future__ import annotations

import asyncio
import tomllib
from typing import Any

import aiohttp
import pytest

from classifier.speculation import expected_tokens_per_step
from classifier.tokens import TokenCounter
from classifier.types import Route
from gateway.config import parse_config
from tooling.configured_stack import configured_stack

ROUTES = """
[routes.plain]
urls = ["http://gpu:8000"]
method = "none"
[routes.eagle-dyn]
urls = ["http://gpu:8001"]
method = "eagle3"
num_speculative_tokens = 4
num_speculative_tokens_per_batch_size = [[1, 2, 4], [3, 8, 2], [9, 256, 0]]
"""
STRUCTURED = {
    "model": "emulated-model",
    "messages": [{"role": "user", "content": "Give me the JSON for a user record"}],
    "response_format": {"type": "json_object"},
    "temperature": 0.0,
    "max_tokens": 16,
}


async def _decide(session: aiohttp.ClientSession, gateway: str) -> dict[str, Any]:
    async with session.post(f"{gateway}/decide/v1/chat/completions", json=STRUCTURED) as resp:
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
        return body


async def test_a_dynamic_route_is_served_routed_to_and_priced_at_its_k(
    tokens: TokenCounter,
) -> None:
    config = parse_config(tomllib.loads(ROUTES) | {"routing": {"profile": "off"}})
    dyn = Route("eagle-dyn")
    async with (
        configured_stack(config, time_scale=0.05, tokens=tokens) as stack,
        aiohttp.ClientSession() as session,
    ):
        emulator = stack.emulators[dyn]
        assert emulator.mode == "dynamic" and emulator.num_speculative_tokens == 4
        assert emulator.k_by_batch_size()[1:10] == [4, 4, 2, 2, 2, 2, 2, 2, 0]
        idle = await _decide(session, stack.gateway)
        assert idle["why"]["k"] == {"eagle-dyn": 4}
        assert idle["route"] == "eagle-dyn", idle  # structured output, idle: speculate
        async with session.post(f"{stack.gateway}/v1/chat/completions", json=STRUCTURED) as resp:
            assert resp.status == 200 and resp.headers["x-specroute-route"] == "eagle-dyn"
            await resp.read()
        # Two long answers held on it: a request would join a batch of 3, where K is 2.
        held = {**STRUCTURED, "max_tokens": 4000, "stream": True}
        forced = {"x-specroute-route": "eagle-dyn"}
        streams = [
            await session.post(f"{stack.gateway}/v1/chat/completions", json=held, headers=forced)
            for _ in range(2)
        ]
        try:
            for s in streams:
                assert s.status == 200
                await s.content.readline()  # decoding now
            loaded = await _decide(session, stack.gateway)
            assert loaded["why"]["k"] == {"eagle-dyn": 2}, loaded["why"]
            a, tokens = loaded["why"]["alpha"]["eagle-dyn"], loaded["why"]["tokens_per_step"]
            assert tokens["eagle-dyn"] == pytest.approx(expected_tokens_per_step(a, 2), abs=1e-3)
            assert tokens["eagle-dyn"] < expected_tokens_per_step(a, 4)
        finally:
            for s in streams:
                s.close()
            await asyncio.sleep(0)
