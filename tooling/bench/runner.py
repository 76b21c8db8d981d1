"""Run every cell against every target, one target at a time, and keep everything measured.

Targets run one after another, never at once: baseline and speculative
usually share one GPU, and a run must not be slowed by another's load. Around
each run the speculative backend's vllm:spec_decode_* counters are scraped
(their delta is the run's acceptance, vLLM's ground truth) and, while the
speculative target runs, its KV-cache usage is sampled (its peak answers
`advise`'s "spare memory?").
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
from tooling.bench.targets import acceptance_json, kv_usage, scrape
from tooling.loadgen import Result, run_closed_loop, run_open_loop

KV_SAMPLE_S = 0.5


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
            progress.start(label, 0 if duration_s is not None else len(cell.requests))
            before = await scrape(session, spec_metrics_url) if spec_metrics_url else None
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
            after = await scrape(session, spec_metrics_url) if spec_metrics_url else None
            cell_run.runs[name] = Run(results, wall, acceptance_json(before, after))
            progress.finish()
        done.append(cell_run)


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
