"""Fixtures for the emulator tests: real emulated servers on 127.0.0.1.

`emulator(mode, **knobs)` starts one emulated vLLM server through
pytest-aiohttp's test server and returns a client for it; both are closed at
teardown. `read_sse(resp)` reads a streamed answer into its JSON events.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from tooling.emulator import EmulatorConfig, create_emulator_app

StartEmulator = Callable[..., Awaitable[TestClient[Any, Any]]]
ReadSse = Callable[[ClientResponse], Awaitable[list[Any]]]

FAST = 0.05  # time_scale for tests that do not measure time


@pytest.fixture
def emulator(aiohttp_client: Any) -> StartEmulator:
    async def start(mode: str = "speculative", **knobs: Any) -> TestClient[Any, Any]:
        knobs.setdefault("time_scale", FAST)
        client: TestClient[Any, Any] = await aiohttp_client(
            create_emulator_app(EmulatorConfig(mode=mode, **knobs))  # type: ignore[arg-type]
        )
        return client

    return start


async def _read_sse(resp: ClientResponse) -> list[Any]:
    """Every `data:` event of a stream, JSON-decoded; the final [DONE] as the string."""
    events: list[Any] = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line.removeprefix("data: ")
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


@pytest.fixture
def read_sse() -> ReadSse:
    return _read_sse


def chat(content: str, **extra: Any) -> dict[str, Any]:
    """A chat request body (helper for the tests of this folder)."""
    return {"model": "smollm2-135m", "messages": [{"role": "user", "content": content}], **extra}


@pytest.fixture
def chat_body() -> Callable[..., dict[str, Any]]:
    return chat
