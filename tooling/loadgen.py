"""Drive requests at a target (vLLM, the emulator or the gateway) and time each one.

Every request is streamed with usage included, as vLLM's own benchmark does:
time to first token is the first chunk carrying text, the token count comes
from the final usage chunk, and so do vLLM's per-request speculative metrics
(`metrics.speculative_decoding`, when the server was started with
--per-request-spec-decode-metrics), which is how the bench measures acceptance
per request. With stream=False the same request is sent whole (no TTFT) and
the usage and metrics come from the body. The gateway's route headers are kept
when the target is the gateway. Each Result carries its request's index, so
runs of the same request list against different targets can be paired request
by request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from gateway.wire.proxy import has_token
from tooling.workloads import Request


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
    index: int = -1  # position in the request list that was sent
    spec_drafted: int | None = None  # per-request metrics: draft tokens proposed...
    spec_accepted: int | None = None  # ...and accepted (speculative server only)

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (vLLM bench's definition)."""
        if self.ttft_s is None or not self.completion_tokens or self.completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)


OnDone = Callable[[Result], None]


async def send_one(
    session: aiohttp.ClientSession,
    base_url: str,
    request: Request,
    index: int = -1,
    headers: Mapping[str, str] | None = None,
    *,
    stream: bool = True,
) -> Result:
    body: dict[str, Any] = {**request.body, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    else:
        body.pop("stream_options", None)
    started = time.perf_counter()
    ttft = None
    route = reason = None
    usage: dict[str, Any] = {}
    spec: dict[str, Any] = {}

    def failed(status: int, error: str) -> Result:
        return Result(
            request.workload,
            False,
            status,
            time.perf_counter() - started,
            ttft,
            None,
            None,
            route,
            reason,
            error,
            index,
        )

    try:
        async with session.post(f"{base_url}{request.path}", json=body, headers=headers) as resp:
            route = resp.headers.get("x-specroute-route")
            reason = resp.headers.get("x-specroute-reason")
            if resp.status != 200:
                return failed(resp.status, (await resp.read())[:200].decode(errors="replace"))
            if not stream:
                whole = await resp.json()
                if not isinstance(whole, dict) or "error" in whole:
                    return failed(200, str(whole)[:200])
                usage = whole.get("usage") or {}
                spec = _spec_metrics(whole) or {}
            while stream and (line := await resp.content.readline()):
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return failed(200, str(chunk["error"]))
                if ttft is None and has_token(chunk):
                    ttft = time.perf_counter() - started
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
                spec = _spec_metrics(chunk) or spec
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return failed(0, f"{type(exc).__name__}: {exc}")
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
        None,
        index,
        _int(spec.get("num_draft_tokens")),
        _int(spec.get("num_accepted_draft_tokens")),
    )


def _spec_metrics(doc: Any) -> dict[str, Any] | None:
    """vLLM's per-request `metrics.speculative_decoding` in a body or a chunk, if there."""
    metrics = doc.get("metrics") if isinstance(doc, dict) else None
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    return spec if isinstance(spec, dict) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def run_closed_loop(
    session: aiohttp.ClientSession,
    base_url: str,
    requests: Sequence[Request],
    concurrency: int,
    on_done: OnDone | None = None,
    *,
    deadline: float | None = None,
    stream: bool = True,
) -> list[Result]:
    """Keep `concurrency` requests in flight until all are done; results in request order.

    With a `deadline` (time.perf_counter() value) no request starts after it,
    so the list may be a prefix of `requests` (in index order, gaps possible).
    """
    results: list[Result | None] = [None] * len(requests)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(requests)):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            if deadline is not None and time.perf_counter() >= deadline:
                return
            i = queue.get_nowait()
            result = await send_one(session, base_url, requests[i], i, stream=stream)
            results[i] = result
            if on_done is not None:
                on_done(result)

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return [r for r in results if r is not None]


async def run_open_loop(
    session: aiohttp.ClientSession,
    base_url: str,
    requests: Sequence[Request],
    offsets_s: Sequence[float],
    on_done: OnDone | None = None,
    *,
    deadline: float | None = None,
) -> list[Result]:
    """Send request i at `offsets_s[i]` seconds after the start, whatever is in flight.

    Open loop, as a real client population behaves (Poisson arrivals, replayed
    traffic): a slow target builds a queue instead of slowing the senders.
    """
    started = time.perf_counter()

    async def one(i: int) -> Result | None:
        due = started + offsets_s[i]
        if deadline is not None and due >= deadline:
            return None
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        result = await send_one(session, base_url, requests[i], i)
        if on_done is not None:
            on_done(result)
        return result

    done = await asyncio.gather(*(one(i) for i in range(len(requests))))
    return [r for r in done if r is not None]


async def scrape_spec_counters(
    session: aiohttp.ClientSession, base_url: str
) -> tuple[float, float, float]:
    """(drafts, draft tokens, accepted tokens) from a vLLM-compatible /metrics."""
    from gateway.backends.scraper import parse_metrics

    async with session.get(f"{base_url}/metrics") as resp:
        scrape = parse_metrics(await resp.text(), at=time.monotonic())
    return (scrape.drafts or 0.0, scrape.draft_tokens or 0.0, scrape.accepted_tokens or 0.0)
