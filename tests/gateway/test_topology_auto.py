"""shared_gpu = "auto" over emulated pairs: one shared emulated GPU in one process, and
two `specroute emulate` processes (a GPU each), as the issue asks.

Before, the default was `shared_gpu = true`, taken on trust: with two servers on
separate GPUs the gateway at concurrency 8 put everything on one server and was
slower than the better static route. Now the gateway measures it. The time scale
is 0.25 so that the modelled GPU time, not this machine's CPU, is what it measures.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.config import parse_config
from tooling.loadgen import run_closed_loop
from tooling.local_stack import MODEL, local_stack, serve_app, wait_healthy
from tooling.workloads import MIXES, build

pytestmark = pytest.mark.slow
TIME_SCALE = 0.25
# The cost model's topology detector is what is tested here (policy "profiled" measures
# the overlap in its profile instead: tests/gateway/test_profiler.py).
COST_MODEL = {"policy": "cost-model"}
REQUESTS = build(MIXES["mixed"], 50, model=MODEL, seed=5)


async def gpu_shared(session: aiohttp.ClientSession, gateway: str) -> float:
    async with session.get(f"{gateway}/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        if family.name == "specroute_gpu_shared":
            return float(family.samples[0].value)
    raise AssertionError("specroute_gpu_shared is not exported")


async def verdict_under_load(gateway: str) -> tuple[float, int]:
    async with aiohttp.ClientSession() as session:
        results = await run_closed_loop(session, gateway, REQUESTS, 8)
        assert all(r.ok for r in results)
        probes = sum(r.reason == "topology-probe" for r in results)
        return await gpu_shared(session, gateway), probes


async def test_one_shared_emulated_gpu_is_found(tokens: TokenCounter) -> None:
    async with local_stack(
        time_scale=TIME_SCALE, tokens=tokens, gpus=1, routing=COST_MODEL
    ) as stack:
        shared, probes = await verdict_under_load(stack.gateway)
    assert shared == 1.0, f"probes sent: {probes}"
    assert probes <= 12


@pytest.fixture
async def two_processes(unused_tcp_port_factory: object) -> AsyncIterator[list[str]]:
    """Two `specroute emulate` processes: each has its own emulated GPU."""
    ports = [unused_tcp_port_factory() for _ in range(2)]  # type: ignore[operator]
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.cli",
            "emulate",
            "--mode",
            mode,
            "--port",
            str(port),
            "--time-scale",
            str(TIME_SCALE),
            "--model",
            MODEL,
            "--per-request-spec-decode-metrics",
            "summary" if mode == "speculative" else "none",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        for mode, port in zip(("speculative", "baseline"), ports, strict=True)
    ]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for url in urls:
            await wait_healthy(url)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
            await proc.wait()


async def test_two_emulate_processes_are_found_apart(
    two_processes: list[str], tokens: TokenCounter
) -> None:
    spec, base = two_processes
    config = parse_config(
        {
            "backends": {"speculative": {"urls": [spec]}, "baseline": {"urls": [base]}},
            "routing": COST_MODEL,
        }
    )
    runner, gateway = await serve_app(create_app(config, tokens=tokens))
    try:
        shared, probes = await verdict_under_load(gateway)
    finally:
        await runner.cleanup()
    assert shared == 0.0, f"probes sent: {probes}"
    assert probes <= 12
