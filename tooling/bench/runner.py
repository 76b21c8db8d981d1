"""Run every cell against every target, one target at a time, and keep everything measured.

Targets run one after another, never at once: baseline and speculative
usually share one GPU, and a run must not be slowed by another's load. Around
each run the speculative backend's vllm:spec_decode_* counters are scraped
(their delta is the run's acceptance, vLLM's ground truth) and, while the
speculative target runs, its KV-cache usage is sampled (its peak answers
`advise`'s "spare memory?"). The "dynamic" target (one vLLM server with dynamic
speculative decoding, not behind the gateway) drafts on its own, so around its
run its own counters are read instead, and likewise around each `route:NAME`
target's (N routes, every route benched alone: tooling/bench/routes.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tooling.bench.plan import Cell
from tooling.bench.progress import Progress
from tooling.bench.routes import ROUTE_PREFIX, is_gateway
from tooling.bench.targets import acceptance_json, kv_usage, scrape
from tooling.loadgen import Result, run_closed_loop, run_open_loop

KV_SAMPLE_S = 0.5
DYNAMIC = "dynamic"  # a single server with dynamic speculative decoding (stats.py)
# How long a gateway target may take to see the servers idle before its run.
_SETTLE_MAX_S = 5.0


@dataclass(slots=True)
class Run:
    """One target's pass over one cell."""

    results: list[Result]
    wall_s: float
    counter_acceptance: dict[str, float] | None = None


@dataclass(slots=True)
class CellRun:
    cell: Cell
    runs: dict[str, Run] = field(default_factory=dict)
    spec_kv_peak: float | None = None


async def run_cells(
    session: aiohttp.ClientSession,
    targets: dict[str, str],
    cells: list[Cell],
    *,
    spec_metrics_url: str | None,
    duration_s: float | None,
    progress: Progress,
    done: list[CellRun],
) -> None:
    """Append each finished cell to `done` (so an interrupted bench keeps what it has)."""
    for cell in cells:
        cell_run = CellRun(cell)
        for name, url in targets.items():
            label = f"{cell.load.label} {cell.group} -> {name}"
            if is_gateway(name):
                await _gateway_settled(session, url)
            progress.start(label, 0 if duration_s is not None else len(cell.requests))
            # A server benched alone drafts on its own: its own counters are its run's.
            own = name == DYNAMIC or name.startswith(ROUTE_PREFIX)
            counters_url = url if own else spec_metrics_url
            before = await scrape(session, counters_url) if counters_url else None
            sampler = None
            if spec_metrics_url and name == "speculative":
                sampler = asyncio.create_task(_kv_peak(session, spec_metrics_url, cell_run))
            started = time.perf_counter()
            deadline = started + duration_s if duration_s is not None else None
            try:
                if cell.offsets_s is None:
                    results = await run_closed_loop(
                        session,
                        url,
                        cell.requests,
                        int(cell.load.value),
                        progress.tick,
                        deadline=deadline,
                    )
                else:
                    results = await run_open_loop(
                        session,
                        url,
                        cell.requests,
                        cell.offsets_s,
                        progress.tick,
                        deadline=deadline,
                    )
            finally:
                if sampler is not None:
                    sampler.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sampler
            wall = time.perf_counter() - started
            after = await scrape(session, counters_url) if counters_url else None
            cell_run.runs[name] = Run(results, wall, acceptance_json(before, after))
            progress.finish()
        done.append(cell_run)


async def _gateway_settled(session: aiohttp.ClientSession, url: str) -> None:
    """Wait until the gateway's view of the servers no longer shows the previous
    target's load (its /stats: nothing in flight, no other clients' requests at
    the last scrape), at most _SETTLE_MAX_S.

    The targets run one after the other on the same servers: the direct runs
    just before the gateway's are other clients' load to it, and its scrape of
    them is up to an interval old. Without this, the gateway's first decisions
    of a run answered to load that had already finished (in the demo it put
    code on the baseline because the speculative server "had" 2 running).
    A gateway without /stats (or behind auth) is not waited for.
    """
    deadline = time.perf_counter() + _SETTLE_MAX_S
    while time.perf_counter() < deadline:
        try:
            async with session.get(f"{url}/stats") as resp:
                if resp.status != 200:
                    return
                backends = (await resp.json()).get("backends", {})
        except (aiohttp.ClientError, ValueError):
            return
        if all(not b.get("inflight") and not b.get("others") for b in backends.values()):
            return
        await asyncio.sleep(0.1)


async def _kv_peak(session: aiohttp.ClientSession, url: str, cell_run: CellRun) -> None:
    while True:
        usage = await kv_usage(session, url)
        if usage is not None:
            cell_run.spec_kv_peak = max(cell_run.spec_kv_peak or 0.0, usage)
        await asyncio.sleep(KV_SAMPLE_S)


def result_json(r: Result) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": r.index,
        "workload": r.workload,
        "ok": r.ok,
        "status": r.status,
        "e2e_s": round(r.e2e_s, 6),
        "ttft_s": None if r.ttft_s is None else round(r.ttft_s, 6),
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
    }
    optional = {
        "route": r.route,
        "reason": r.reason,
        "spec_drafted": r.spec_drafted,
        "spec_accepted": r.spec_accepted,
        "error": r.error,
    }
    out.update({k: v for k, v in optional.items() if v is not None})
    return out
