"""Drive requests at a target (vLLM, the emulator or the gateway) and time each one.

Every request is streamed with usage included, as vLLM's own benchmark does:
time to first token is the first chunk carrying text, the token count comes
from the final usage chunk, and the gateway's route headers are kept when the
target is the gateway.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from gateway.workloads import Request


@dataclass(frozen=True, slots=True)
class Result:
    workload: str
    ok: bool
    status: int
    e2e_s: float
    ttft_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    route: str | None  # x-specroute-route, when the target is the gateway
    reason: str | None
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (vLLM bench's definition)."""
        if self.ttft_s is None or not self.completion_tokens or self.completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)


async def send_one(session: aiohttp.ClientSession, base_url: str, request: Request) -> Result:
    body = {**request.body, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    ttft = None
    usage: dict[str, Any] = {}
    try:
        async with session.post(f"{base_url}{request.path}", json=body) as resp:
            route, reason = (
                resp.headers.get("x-specroute-route"),
                resp.headers.get("x-specroute-reason"),
            )
            if resp.status != 200:
                text = (await resp.read())[:200].decode(errors="replace")
                return Result(
                    request.workload,
                    False,
                    resp.status,
                    time.perf_counter() - started,
                    None,
                    None,
                    None,
                    route,
                    reason,
                    text,
                )
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return Result(
                        request.workload,
                        False,
                        200,
                        time.perf_counter() - started,
                        ttft,
                        None,
                        None,
                        route,
                        reason,
                        str(chunk["error"]),
                    )
                if ttft is None and _has_text(chunk):
                    ttft = time.perf_counter() - started
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Result(
            request.workload,
            False,
            0,
            time.perf_counter() - started,
            None,
            None,
            None,
            None,
            None,
            f"{type(exc).__name__}: {exc}",
        )
    return Result(
        request.workload,
        True,
        200,
        time.perf_counter() - started,
        ttft,
        usage.get("prompt_tokens"),
        usage.get("completion_tokens"),
        route,
        reason,
    )


def _has_text(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content") or delta.get("tool_calls"):
            return True
    return False


async def run_closed_loop(
    session: aiohttp.ClientSession,
    base_url: str,
    requests: Sequence[Request],
    concurrency: int,
    on_done: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Keep `concurrency` requests in flight until all are done; results in request order."""
    results: list[Result | None] = [None] * len(requests)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(requests)):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            results[i] = await send_one(session, base_url, requests[i])
            if on_done is not None:
                on_done(results[i])  # type: ignore[arg-type]

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return [r for r in results if r is not None]


async def scrape_spec_counters(
    session: aiohttp.ClientSession, base_url: str
) -> tuple[float, float, float]:
    """(drafts, draft tokens, accepted tokens) from a vLLM-compatible /metrics."""
    from gateway.scraper import parse_metrics

    async with session.get(f"{base_url}/metrics") as resp:
        scrape = parse_metrics(await resp.text(), at=time.monotonic())
    return (scrape.drafts or 0.0, scrape.draft_tokens or 0.0, scrape.accepted_tokens or 0.0)
