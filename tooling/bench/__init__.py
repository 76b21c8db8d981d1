"""`specroute bench`: is speculative decoding worth it on this traffic? Measured, side by side.

The same requests go to every target (typically the baseline vLLM, the
speculative vLLM and the gateway in front of both; optionally "dynamic", one
vLLM server with dynamic speculative decoding, the single-server alternative),
one target at a time, at each load level; the report pairs them request by
request: the speedup of each target over the baseline, acceptance from vLLM's
counters and from the per-request metrics, the per-request oracle (the faster
backend) and the gateway's regret against it, and the gateway against the
dynamic server. Outputs: a table on stdout, a progress bar (or
one line per run) on stderr, a JSON document (schema in tooling/bench/report.py)
and a PNG (tooling/bench/plot.py). Every header says which backends answered,
and says EMULATED when the emulator did, so its figures are never taken for a
GPU's.

run_bench is the core; `specroute bench` (tooling/bench/cli.py) and
`specroute demo` are thin layers on it.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from tooling.bench.intervals import describe as describe_intervals
from tooling.bench.plan import Load, cells, is_file
from tooling.bench.progress import Progress
from tooling.bench.report import SCHEMA, header, table
from tooling.bench.runner import CellRun, result_json, run_cells
from tooling.bench.stats import SPEC, rows, whole_run
from tooling.bench.targets import TargetInfo, probe, wait_for_profile

_MAX_CONNECTIONS = 1024


@dataclass(frozen=True, slots=True)
class BenchOptions:
    targets: dict[str, str]  # name -> base URL; baseline/speculative/dynamic/gateway are special
    workload: str = "mixed"
    concurrency: list[int] | None = None
    rates: list[float] | None = None
    replay_timing: bool = False
    time_scale: float = 1.0
    requests: int | None = None
    duration_s: float | None = None
    model: str | None = None
    seed: int = 0
    json_path: Path | None = None
    plot_path: Path | None = None
    spec_metrics_url: str | None = None  # default: the "speculative" target
    read_timeout_s: float = 600.0
    command: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return "replay" if self.replay_timing else "rate" if self.rates else "concurrency"

    def loads(self) -> list[Load]:
        if self.replay_timing:
            return [Load("replay", self.time_scale)]
        if self.rates:
            return [Load("rate", r) for r in self.rates]
        return [Load("concurrency", c) for c in self.concurrency or [1]]


@dataclass(slots=True)
class BenchOutcome:
    doc: dict[str, Any]
    text: str
    failures: int
    plot_error: str | None = None


async def run_bench(
    opts: BenchOptions, *, out: TextIO | None = None, tag: str = "bench"
) -> BenchOutcome:
    """Probe, run every cell, then print the table and write the JSON and the PNG.

    If cancelled (Ctrl-C, `timeout --signal=INT`), what finished is still
    reported and written before the cancellation goes on.
    """
    out = out or sys.stdout
    started, wall0 = datetime.datetime.now(datetime.UTC), time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=opts.read_timeout_s)
    # Open-loop runs may hold many requests in flight: that is their point.
    connector = aiohttp.TCPConnector(limit=_MAX_CONNECTIONS)
    done: list[CellRun] = []
    complete = False
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        infos = await asyncio.gather(*(probe(session, n, u) for n, u in opts.targets.items()))
        targets = {i.name: i for i in infos}
        print(_preamble(targets), file=sys.stderr, flush=True)
        for info in infos:  # a gateway's start-up profile must not overlap a timed request
            if info.kind == "specroute gateway":
                await wait_for_profile(aiohttp.ClientSession, info.url, sys.stderr)
        model = opts.model or next((i.model for i in infos if i.model), None)
        plan = cells(
            workload=opts.workload,
            loads=opts.loads(),
            requests=opts.requests,
            duration_s=opts.duration_s,
            seed=opts.seed,
            model=model,
            counter=_counter() if is_file(opts.workload) else None,
        )
        total = sum(len(c.requests) for c in plan) * len(targets)
        spec_url = opts.spec_metrics_url or opts.targets.get(SPEC)
        emulated = any(i.emulated for i in infos)
        tagged = f"{tag}{' EMULATED' if emulated else ''}"
        progress = Progress(0 if opts.duration_s is not None else total, tag=tagged)
        try:
            await run_cells(
                session,
                opts.targets,
                plan,
                spec_metrics_url=spec_url,
                duration_s=opts.duration_s,
                progress=progress,
                done=done,
            )
            complete = True
        finally:
            progress.close()
            outcome = _finish(opts, targets, done, started, time.perf_counter() - wall0, complete)
            print(outcome.text, file=out, flush=True)
    return outcome


def _counter() -> Any:
    from classifier.tokens import load_tiktoken_counter

    return load_tiktoken_counter()


def _preamble(targets: dict[str, TargetInfo]) -> str:
    """Said before the run starts (stderr), so nobody waits minutes to learn what answered."""
    emulated = any(i.emulated for i in targets.values())
    lines = ["specroute bench: EMULATED backends: not real GPU figures" if emulated else ""]
    lines += [f"  {i.describe()}" for i in targets.values()]
    return "\n".join(line for line in lines if line)


def _finish(
    opts: BenchOptions,
    targets: dict[str, TargetInfo],
    done: list[CellRun],
    started: datetime.datetime,
    duration_s: float,
    complete: bool,
) -> BenchOutcome:
    per_workload, overall = rows(done)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "emulated": any(i.emulated for i in targets.values()),
        "started": started.isoformat(timespec="seconds"),
        "duration_s": round(duration_s, 3),
        "complete": complete,
        "command": opts.command,
        "workload": opts.workload,
        "mode": opts.mode,
        "concurrency": [int(c) for c in opts.concurrency or [1]]
        if opts.mode == "concurrency"
        else None,
        "rates": opts.rates if opts.mode == "rate" else None,
        "time_scale": opts.time_scale if opts.mode == "replay" else None,
        "requests_per_cell": opts.requests,
        "duration_per_cell_s": opts.duration_s,
        "seed": opts.seed,
        "targets": {n: i.to_json() for n, i in targets.items()},
        "rows": per_workload,
        "overall": overall,
        **_whole_run(done),
        "intervals": describe_intervals(),
        "cells": [_cell_json(c) for c in done],
    }
    failures = sum(not r.ok for c in done for run in c.runs.values() for r in run.results)
    text = f"{header(doc)}\n{table(doc)}"
    if not complete:
        text += "\nINTERRUPTED: the figures above cover the cells that finished"
    if failures:
        text += f"\n{failures} request(s) failed (see the JSON for their errors)"
    plot_error = None
    if opts.json_path is not None:
        opts.json_path.parent.mkdir(parents=True, exist_ok=True)
        opts.json_path.write_text(json.dumps(doc, indent=1) + "\n")
        text += f"\nwrote {opts.json_path}"
    if opts.plot_path is not None and done:
        from tooling.bench.plot import PlotUnavailable, plot

        try:
            plot(doc, opts.plot_path)
            text += f"\nwrote {opts.plot_path}"
        except PlotUnavailable as exc:
            plot_error = str(exc)
            text += f"\nNO PLOT: {exc}"
    return BenchOutcome(doc, text, failures, plot_error)


def _whole_run(done: list[CellRun]) -> dict[str, Any]:
    """regret (and, with a dynamic target, its two ratios) over every load and workload."""
    run = whole_run(done)
    out = {"regret": run.get("regret"), "regret_ci": run.get("regret_ci")}
    if "n_route" in run:
        out["n_route"] = run["n_route"]
    if "gateway_vs_dynamic" in run:
        for key in ("gateway_vs_dynamic", "dynamic_regret"):
            out[key], out[f"{key}_ci"] = run[key], run[f"{key}_ci"]
    return out


def _cell_json(c: CellRun) -> dict[str, Any]:
    return {
        "load": c.cell.load.to_json(),
        "group": c.cell.group,
        "spec_kv_peak": c.spec_kv_peak,
        "runs": {
            name: {
                "wall_s": round(run.wall_s, 4),
                "counter_acceptance": run.counter_acceptance,
                "results": [result_json(r) for r in run.results],
            }
            for name, run in c.runs.items()
        },
    }


__all__ = ["BenchOptions", "BenchOutcome", "run_bench"]
