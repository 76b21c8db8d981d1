"""A client that goes away aborts its request, with the production server setting.

These run the emulator the way `specroute emulate` does: a real AppRunner and
TCPSite with handler_cancellation=True (run_app's default is False; the test
server's is True, so testing only through it would hide a wrong setting).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.support import wait_until
from tooling.emulator import EmulatorConfig, create_emulator_app

BODY = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4000, "ignore_eos": True}
Serve = Callable[..., Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    runners: list[web.AppRunner] = []

    async def start(**knobs: Any) -> str:
        config = EmulatorConfig(mode="speculative", time_scale=0.2, **knobs)
        runner = web.AppRunner(create_emulator_app(config), handler_cancellation=True)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        return f"http://{host}:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def _state(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with session.get(f"{base}/emulator/state") as resp:
        state: dict[str, Any] = await resp.json()
    return state


async def _wait_for_abort(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async def aborted() -> dict[str, Any] | None:
        state = await _state(session, base)
        return state if state["client_aborts"] else None

    return await wait_until(aborted, "the request aborted")


async def _abort_count(session: aiohttp.ClientSession, base: str) -> float:
    text = await (await session.get(f"{base}/metrics")).text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "vllm:request_success_total"
                and sample.labels["finished_reason"] == "abort"
            ):
                return sample.value
    raise AssertionError("no abort series")


async def test_stream_disconnect_aborts_and_counts(serve: Serve) -> None:
    base = await serve()
    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"{base}/v1/chat/completions", json={**BODY, "stream": True})
        for _ in range(3):
            await resp.content.readline()
        resp.close()  # drop the connection mid-stream
        state = await _wait_for_abort(session, base)
        assert state["finished"] == {"abort": 1} and state["running"] == state["waiting"] == 0
        assert await _abort_count(session, base) == 1


async def test_non_streamed_disconnect_aborts(serve: Serve) -> None:
    base = await serve()
    async with aiohttp.ClientSession() as session:
        with pytest.raises(asyncio.TimeoutError):
            await session.post(
                f"{base}/v1/chat/completions", json=BODY, timeout=aiohttp.ClientTimeout(total=0.2)
            )
        state = await _wait_for_abort(session, base)
        assert state["running"] == 0 and await _abort_count(session, base) == 1


async def test_abort_while_waiting_in_queue(serve: Serve) -> None:
    base = await serve(max_num_seqs=1)
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(session.post(f"{base}/v1/chat/completions", json=BODY))

        async def first_running() -> bool:
            return (await _state(session, base))["running"] == 1  # type: ignore[no-any-return]

        await wait_until(first_running, "the first request running")
        with pytest.raises(asyncio.TimeoutError):
            await session.post(
                f"{base}/v1/chat/completions", json=BODY, timeout=aiohttp.ClientTimeout(total=0.1)
            )
        state = await _wait_for_abort(session, base)
        assert state["waiting"] == 0 and state["running"] == 1
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first


async def test_client_aborts_can_be_left_out_of_metrics(serve: Serve) -> None:
    """vLLM 0.32 itself does not count client aborts in request_success: a knob matches it."""
    base = await serve(count_client_aborts=False)
    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"{base}/v1/chat/completions", json={**BODY, "stream": True})
        await resp.content.readline()
        resp.close()
        state = await _wait_for_abort(session, base)
        assert state["client_aborts"] == 1 and await _abort_count(session, base) == 0
