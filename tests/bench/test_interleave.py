"""tooling/interleave.py, what the real-vLLM tier and benchmarks/real_routes.py time with:
the bodies and route tables on their own, then prime, idle and timed against two
emulated vLLM servers and a gateway over them on 127.0.0.1."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.config import parse_config
from tooling import interleave
from tooling.emulator import EmulatorConfig, create_emulator_app
from tooling.local_stack import serve_app

MODEL = EmulatorConfig(mode="baseline").model
K = {"none": 0, "ngram-k4": 4}


def _numbered(rng: random.Random) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"n {rng.randrange(10**6)}"}]}


def _long(rng: random.Random) -> dict[str, Any]:
    return {**_numbered(rng), "max_tokens": 500}


def test_mix_interleaves_caps_and_repeats() -> None:
    workloads = {"short": _numbered, "long": _long}
    bodies = interleave.mix(workloads, 3, "s", "m", 64)
    assert [name for name, _ in bodies] == ["short", "long"] * 3
    assert all(b["model"] == "m" and b["max_tokens"] == 64 for _, b in bodies)
    assert bodies == interleave.mix(workloads, 3, "s", "m", 64)
    assert bodies != interleave.mix(workloads, 3, "t", "m", 64)
    assert interleave.mix(workloads, 1, "s", "m", 1000)[1][1]["max_tokens"] == 500


def test_route_tables_load_in_order() -> None:
    urls = {"ngram-k4": "http://a:1", "none": "http://b:2"}
    config = parse_config({"routes": interleave.route_tables(urls, K)})
    assert [r.value for r in config.routes] == ["ngram-k4", "none"]
    assert [(r.method, r.num_speculative_tokens) for r in config.routes.values()] == [
        ("ngram", 4),
        ("none", 0),
    ]


@dataclass
class Stack:
    urls: dict[str, str]
    gateway: str
    app: web.Application


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    runners = []
    urls = {}
    servers = {
        "none": EmulatorConfig(mode="baseline"),
        "ngram-k4": EmulatorConfig(mode="speculative"),
    }
    for name, emulated in servers.items():
        runner, urls[name] = await serve_app(create_emulator_app(emulated))
        runners.append(runner)
    # The rules policy: no start-up profile, so the servers are idle until the test sends.
    config = parse_config(
        {"routes": interleave.route_tables(urls, K), "routing": {"policy": "rules"}}
    )
    app = create_app(config)
    runner, gateway = await serve_app(app)
    runners.append(runner)
    try:
        yield Stack(urls, gateway, app)
    finally:
        for r in reversed(runners):
            await r.cleanup()


async def test_prime_timed_and_idle_against_live_servers(stack: Stack) -> None:
    body = {**_numbered(random.Random(1)), "model": MODEL, "max_tokens": 8}
    async with aiohttp.ClientSession() as http:
        assert await interleave.prime(http, stack.urls.values(), body) == {
            url: 200 for url in stack.urls.values()
        }
        assert await interleave.idle(http, stack.urls.values(), [stack.app])

        forced = await interleave.timed(http, stack.gateway, body, route="ngram-k4")
        assert forced.status == 200 and forced.seconds is not None and forced.seconds > 0
        assert forced.route == "ngram-k4" and forced.reason

        direct = await interleave.timed(http, stack.urls["none"], body)
        assert (direct.status, direct.route, direct.reason) == (200, "", "")

        bad = await interleave.timed(http, stack.gateway, {"model": MODEL})  # no messages
        assert bad.seconds is None and bad.status == 400 and "messages" in bad.error

        # A long answer in flight on one server: not idle until it is done.
        long_body = {**body, "max_tokens": 400, "ignore_eos": True}
        running = asyncio.create_task(interleave.timed(http, stack.urls["none"], long_body))
        await asyncio.sleep(0.3)
        assert not await interleave.idle(http, stack.urls.values(), [stack.app], timeout_s=0.3)
        answer = await running
        assert answer.seconds is not None and answer.seconds > 0.6
        assert await interleave.idle(http, stack.urls.values(), [stack.app], timeout_s=5)
