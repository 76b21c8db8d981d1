"""Shadow copies over the emulated vLLM pair (one emulated GPU, as deployed).

- the emulator honours min_tokens and ignore_eos as vLLM does, so a shadow produces
  exactly the user's answer length;
- under steady load (concurrency 8) no shadow runs: the GPU is never idle;
- at concurrency 1 with idle gaps every copy runs, the pairs give a live speedup per
  workload, and the cost model learns from them (both routes' fits, acceptance from
  the speculative side) and stops exploring users of the workloads they cover.

Counts only: figures against the truth are benchmarks/shadow.py's.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from classifier.features import Workload
from classifier.router import ProfiledPolicy
from classifier.tokens import TokenCounter
from classifier.types import Route
from gateway.app import create_app
from gateway.state import METRICS, RUNTIME
from tests.gateway.conftest import ServerFactory
from tests.support import wait_until
from tooling.emulator import EmulatorConfig, SharedGpu, create_emulator_app
from tooling.loadgen import send_one
from tooling.local_stack import MODEL, gateway_config
from tooling.workloads import MIXES, build

Client = TestClient[web.Request, web.Application]
TIME_SCALE = 0.1
SHADOW_ALL = {"share": 1.0}


def _emulators() -> tuple[EmulatorConfig, EmulatorConfig]:
    spec = EmulatorConfig(
        mode="speculative",
        model=MODEL,
        time_scale=TIME_SCALE,
        per_request_spec_decode_metrics="summary",
    )
    return spec, EmulatorConfig(mode="baseline", model=MODEL, time_scale=TIME_SCALE)


@pytest.fixture
async def emulated(aiohttp_server: ServerFactory) -> tuple[str, str, EmulatorConfig]:
    """Two emulated servers on one emulated GPU."""
    spec_cfg, base_cfg = _emulators()
    gpu = SharedGpu()
    spec = await aiohttp_server(create_emulator_app(spec_cfg, gpu))
    base = await aiohttp_server(create_emulator_app(base_cfg, gpu))
    return str(spec.make_url("")), str(base.make_url("")), spec_cfg


@pytest.fixture
async def stack(
    emulated: tuple[str, str, EmulatorConfig], aiohttp_client: Any, tokens: TokenCounter
) -> AsyncIterator[Client]:
    spec, base, spec_cfg = emulated
    config = gateway_config(spec, base, spec_cfg, shadow=SHADOW_ALL)
    client: Client = await aiohttp_client(create_app(config, tokens=tokens))
    policy = client.app[RUNTIME].current.policy
    assert isinstance(policy, ProfiledPolicy)
    # The start-up profile first: its probes would share the GPU with every request.
    await wait_until(lambda: policy.profile is not None, "the profile", timeout_s=60)
    assert policy.shared_gpu() is True  # measured: one emulated GPU
    yield client


def shadow_count(client: Client, outcome: str) -> int:
    registry = client.app[METRICS].registry
    return int(
        sum(
            s.value
            for family in registry.collect()
            if family.name == "specroute_shadow_requests"
            for s in family.samples
            if s.name.endswith("_total") and s.labels["outcome"] == outcome
        )
    )


# ---- the emulator, as vLLM -----------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("structured", [False, True])
async def test_the_emulator_honours_min_tokens_and_ignore_eos(
    aiohttp_client: Any, stream: bool, structured: bool
) -> None:
    spec_cfg, _ = _emulators()
    emulator = await aiohttp_client(create_emulator_app(spec_cfg))
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hi."}],
        "temperature": 0,
        "stream": stream,
    }
    if structured:
        body["response_format"] = {"type": "json_object"}
    if stream:
        body["stream_options"] = {"include_usage": True}

    async def completion_tokens(**extra: Any) -> tuple[int, str]:
        resp = await emulator.post("/v1/chat/completions", json={**body, **extra})
        assert resp.status == 200, await resp.text()
        if not stream:
            doc = await resp.json()
            return doc["usage"]["completion_tokens"], doc["choices"][0]["finish_reason"]
        finish, usage = "", 0
        for line in (await resp.text()).split("\n\n"):
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                for choice in event.get("choices") or ():
                    finish = choice.get("finish_reason") or finish
                usage = (event.get("usage") or {}).get("completion_tokens", usage)
        return usage, finish

    natural, _ = await completion_tokens(max_tokens=1000)
    # ignore_eos: to max_tokens exactly, whatever the natural length; min_tokens = max_tokens too
    for n in (natural // 2 or 1, natural + 37):
        assert await completion_tokens(max_tokens=n, ignore_eos=True) == (n, "length")
        forced = await completion_tokens(max_tokens=n, min_tokens=n, ignore_eos=True)
        assert forced == (n, "length")
    # min_tokens alone: no EOS before it
    longer, finish = await completion_tokens(max_tokens=1000, min_tokens=natural + 20)
    assert longer >= natural + 20 and finish == "stop"
    resp = await emulator.post(
        "/v1/chat/completions", json={**body, "max_tokens": 5, "min_tokens": 6}
    )
    assert resp.status == 400  # vLLM: min_tokens must be <= max_tokens


async def test_a_stop_string_is_not_looked_for_before_min_tokens(aiohttp_client: Any) -> None:
    """vLLM checks stop strings only once min_tokens are out (v1 detokenizer)."""
    spec_cfg, _ = _emulators()
    emulator = await aiohttp_client(create_emulator_app(spec_cfg))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me."}], "seed": 1}
    whole = await (await emulator.post("/v1/chat/completions", json=body)).json()
    text = whole["choices"][0]["message"]["content"]
    stop = text.split()[1]  # a word near the start
    cut = await (await emulator.post("/v1/chat/completions", json={**body, "stop": [stop]})).json()
    assert cut["choices"][0]["finish_reason"] == "stop"
    early = cut["usage"]["completion_tokens"]
    later = await (
        await emulator.post(
            "/v1/chat/completions",
            json={**body, "stop": [stop], "min_tokens": early + 3, "max_tokens": early + 3},
        )
    ).json()
    assert later["usage"]["completion_tokens"] == early + 3  # not cut at the early stop


# ---- the gateway over the emulated pair ---------------------------------------------


async def test_no_shadow_runs_under_steady_load(stack: Client) -> None:
    """Eight clients in a closed loop keep the GPU busy: no copy starts while the load is
    on (checked when the first client is done; after that the load winds down)."""
    requests = build(MIXES["mixed"], 6, model=MODEL, seed=3)
    base = str(stack.make_url(""))
    started_before_end: list[int] = []

    async def client(session: aiohttp.ClientSession, mine: list[Any]) -> None:
        for request in mine:
            result = await send_one(session, base, request)
            assert result.ok, result.error
        if not started_before_end:  # the first client to finish: the load is still on
            started_before_end.append(
                shadow_count(stack, "completed") + shadow_count(stack, "cancelled")
            )

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session, requests[i::8]) for i in range(8)))
    assert started_before_end == [0]
    # A request that shared its GPU cannot be paired: its copy is skipped, never queued.
    assert shadow_count(stack, "skipped") >= len(requests) // 2  # (the tail ran alone)
    assert shadow_count(stack, "cancelled") == shadow_count(stack, "failed") == 0


async def test_idle_gaps_give_pairs_that_the_router_learns(stack: Client) -> None:
    requests = build(MIXES["mixed"], 3, model=MODEL, seed=4)
    policy = stack.app[RUNTIME].current.policy
    assert isinstance(policy, ProfiledPolicy)
    base = str(stack.make_url(""))
    async with aiohttp.ClientSession() as session:
        for i, request in enumerate(requests):
            result = await send_one(session, base, request)
            assert result.ok, result.error
            await wait_until(
                lambda n=i + 1: shadow_count(stack, "completed") == n,  # type: ignore[misc]
                f"shadow {i + 1} to complete in the idle gap",
                timeout_s=30,
            )
    assert shadow_count(stack, "cancelled") == shadow_count(stack, "skipped") == 0
    registry = stack.app[METRICS].registry
    speedups = {
        w: registry.get_sample_value("specroute_shadow_speedup", {"workload": w.value})
        for w in Workload
    }
    seen = {w for w in speedups if any(_workload(stack, r) is w for r in requests)}
    assert seen and all(not math.isnan(speedups[w] or math.nan) for w in seen), speedups
    # Every workload seen was measured on the speculative server, by a user's answer
    # or its shadow copy: each half of a pair teaches the same posteriors.
    measured = {w: n for w, (_, _, n) in policy.acceptance_beliefs()[Route.SPECULATIVE].items()}
    assert seen and all(measured.get(w, 0) > 0 for w in seen), measured


def _workload(client: Client, request: Any) -> Workload:
    from classifier.features import Endpoint, extract_features
    from gateway.state import TOKENS

    config = client.app[RUNTIME].current.config
    features = extract_features(
        request.body, Endpoint.CHAT, client.app[TOKENS], config.routing.features
    )
    return features.workload
