"""What the Envoy tests send and read: bodies, SSE events, the picker's metrics."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tooling.local_stack import MODEL


def chat(content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": 16, **extra}  # fmt: skip


def events(text: str) -> list[str]:
    """The data of each SSE event, in order."""
    return [e.removeprefix("data: ") for e in text.split("\n\n") if e.startswith("data: ")]


def usage_chunks(text: str) -> list[dict[str, Any]]:
    out = []
    for data in events(text):
        if data != "[DONE]" and (chunk := json.loads(data)).get("usage") and not chunk["choices"]:
            out.append(chunk)
    return out


async def metric(url: str, name: str, **labels: str) -> float:
    """The sum of one metric's samples whose labels include `labels` (0 if none)."""
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


async def emulator_state(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/emulator/state") as resp:
        state: dict[str, Any] = await resp.json()
    return state
