"""Every fault knob, at start-up and at run time, seen from a real HTTP client."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

if TYPE_CHECKING:
    from conftest import ReadSse, StartEmulator

STREAM = {"max_tokens": 30, "ignore_eos": True, "stream": True}


async def test_fail_status_from_config(
    emulator: StartEmulator, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("baseline", fail_status=503)
    resp = await client.post("/v1/chat/completions", json=chat_body("x"))
    assert resp.status == 503
    error = (await resp.json())["error"]
    assert error["code"] == 503 and error["type"] == "ServiceUnavailableError"
    assert (await client.get("/health")).status == 200  # the server is up, generation fails


async def test_fail_once_then_recover(
    emulator: StartEmulator, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("speculative")
    resp = await client.post("/emulator/faults", json={"fail_status": 500, "fault_limit": 1})
    assert resp.status == 200 and (await resp.json())["fault_limit_left"] == 1
    assert (await client.post("/v1/chat/completions", json=chat_body("x"))).status == 500
    assert (await client.post("/v1/chat/completions", json=chat_body("x"))).status == 200
    state = await (await client.get("/emulator/state")).json()
    assert state["faults"]["fail_status"] == 0 and state["emulated"] is True


async def test_drop_after_n_chunks(
    emulator: StartEmulator, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("baseline", drop_after_chunks=3)
    resp = await client.post("/v1/chat/completions", json=chat_body("x", **STREAM))
    assert resp.status == 200
    lines: list[bytes] = []
    with pytest.raises(aiohttp.ClientPayloadError):
        async for line in resp.content:
            if line.strip():
                lines.append(line)
    assert len(lines) == 3  # role chunk + 2 content chunks, then the connection is gone
    state = await (await client.get("/emulator/state")).json()
    assert state["finished"] == {"abort": 1} and state["running"] == 0


async def test_error_event_after_n_chunks(
    emulator: StartEmulator, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("speculative", error_after_chunks=3)
    resp = await client.post("/v1/chat/completions", json=chat_body("x", **STREAM))
    assert resp.status == 200
    events = [e for e in (await resp.read()).split(b"\n\n") if e]
    assert len(events) == 5  # role chunk + 2 content chunks, vLLM's error event, [DONE]
    error = json.loads(events[3][len(b"data: ") :])["error"]
    assert error == {
        "message": "Internal server error",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
    assert events[4] == b"data: [DONE]"


async def test_drop_before_response_and_non_streamed(
    emulator: StartEmulator, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("baseline")
    for drop_after in (0, 1):
        await client.post("/emulator/faults", json={"drop_after_chunks": drop_after})
        with pytest.raises(aiohttp.ClientConnectionError):
            await client.post("/v1/chat/completions", json=chat_body("x", max_tokens=5))
    await client.delete("/emulator/faults")
    assert (
        await client.post("/v1/chat/completions", json=chat_body("x", max_tokens=5))
    ).status == 200


async def test_stall_before_response(
    emulator: StartEmulator, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("baseline", stall_s=0.4)
    timeout = aiohttp.ClientTimeout(sock_read=0.1)
    with pytest.raises(asyncio.TimeoutError):
        await client.post(
            "/v1/chat/completions", json=chat_body("x", max_tokens=3), timeout=timeout
        )
    start = time.monotonic()
    resp = await client.post("/v1/chat/completions", json=chat_body("x", max_tokens=3))
    assert resp.status == 200 and time.monotonic() - start >= 0.4


async def test_stall_mid_stream(
    emulator: StartEmulator, read_sse: ReadSse, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("baseline")
    await client.post("/emulator/faults", json={"stall_s": 0.3, "stall_after_chunks": 2})
    resp = await client.post("/v1/chat/completions", json=chat_body("x", **STREAM))
    stamps = []
    async for line in resp.content:
        if line.strip():
            stamps.append(time.monotonic())
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert gaps[1] >= 0.3 and max(gaps) == gaps[1]  # the stall sits after chunk 2
    assert len(stamps) == 1 + 30 + 1  # role, 30 tokens, [DONE]: nothing lost


async def test_refuse_connections(
    emulator: StartEmulator, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("baseline", refuse_connections=True)
    for method, path in (("GET", "/health"), ("POST", "/v1/chat/completions")):
        with pytest.raises(aiohttp.ClientConnectionError):
            await client.request(method, path, json=chat_body("x"))
    state = await (await client.get("/emulator/state")).json()  # admin paths still answer
    assert state["faults"]["refuse_connections"] is True and state["submitted"] == 0
    await client.post("/emulator/faults", json={"refuse_connections": False})
    assert (await client.get("/health")).status == 200


@pytest.mark.parametrize(
    "changes",
    [{"nope": 1}, {"stall_s": "slow"}, {"fail_status": 200}, {"refuse_connections": 1}, [1]],
)
async def test_fault_admin_rejects_bad_input(emulator: StartEmulator, changes: Any) -> None:
    client = await emulator("baseline")
    resp = await client.post("/emulator/faults", json=changes)
    assert resp.status == 400 and (await resp.json())["error"]["type"] == "BadRequestError"
