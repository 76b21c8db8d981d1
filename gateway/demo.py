"""`specroute demo`: the no-GPU main job, on EMULATED backends.

Starts two emulated vLLM servers (speculative and baseline, GPU-shaped timing)
and the gateway in one process, sends a short mixed workload through the
baseline directly, the speculative server directly and the gateway, and prints
per workload what each route gave and what the gateway chose.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

import aiohttp

from gateway.loadgen import Result, run_closed_loop, scrape_spec_counters
from gateway.local_stack import MODEL, local_stack
from gateway.workloads import MIXES, build

TARGETS = ("baseline", "speculative", "gateway")


@dataclass(frozen=True, slots=True)
class Row:
    workload: str
    results: dict[str, list[Result]]
    acceptance: float | None  # accepted / proposed draft tokens, from the counters

    def mean_e2e(self, target: str) -> float:
        return statistics.fmean(r.e2e_s for r in self.results[target])

    def p50(self, target: str) -> float:
        return statistics.median(r.e2e_s for r in self.results[target])

    def tokens_per_s(self, target: str) -> float:
        ok = [r for r in self.results[target] if r.completion_tokens]
        return statistics.fmean(r.completion_tokens / r.e2e_s for r in ok) if ok else 0.0  # type: ignore[operator]

    def oracle(self) -> float:
        pairs = zip(self.results["baseline"], self.results["speculative"], strict=True)
        return statistics.fmean(min(b.e2e_s, s.e2e_s) for b, s in pairs)

    def routes(self) -> str:
        counts = Counter(r.route for r in self.results["gateway"])
        return " ".join(f"{route}:{n}" for route, n in counts.most_common())


async def run_demo(
    *, per_workload: int, concurrency: int, time_scale: float, out: TextIO = sys.stdout
) -> int:
    names = MIXES["demo"]
    print(
        "specroute demo: EMULATED backends (specroute emulate: vLLM's API and metrics, "
        "modelled GPU timing, no model runs)\n"
        f"{len(names)} workloads x {per_workload} requests x {len(TARGETS)} targets, "
        f"concurrency {concurrency}, time scale {time_scale}",
        file=out,
        flush=True,
    )
    started = time.perf_counter()
    rows: list[Row] = []
    failures = 0
    async with local_stack(time_scale=time_scale) as stack, aiohttp.ClientSession() as session:
        urls = {
            "baseline": stack.baseline,
            "speculative": stack.speculative,
            "gateway": stack.gateway,
        }
        for name in names:
            requests = build([name], per_workload, model=MODEL)
            results: dict[str, list[Result]] = {}
            acceptance = None
            for target in TARGETS:
                progress = Progress(f"{name} via {target}", len(requests))
                before = await scrape_spec_counters(session, stack.speculative)
                results[target] = await run_closed_loop(
                    session, urls[target], requests, concurrency, progress.tick
                )
                progress.close()
                if target == "speculative":
                    after = await scrape_spec_counters(session, stack.speculative)
                    drafted = after[1] - before[1]
                    acceptance = (after[2] - before[2]) / drafted if drafted > 0 else None
                failures += sum(not r.ok for r in results[target])
            rows.append(Row(name, results, acceptance))
    print(render(rows), file=out)
    print(
        f"\n[EMULATED] {sum(len(r.results[t]) for r in rows for t in TARGETS)} requests in "
        f"{time.perf_counter() - started:.1f} s, {failures} failed. Figures are from the "
        "emulator's modelled timing, not a real GPU.",
        file=out,
    )
    return 1 if failures else 0


def render(rows: Sequence[Row]) -> str:
    head = (
        f"{'workload':<11} {'e2e p50 (s)':>24} {'tokens/s':>20} {'accept':>7} "
        f"{'speedup vs base':>16}  gateway routes"
    )
    sub = (
        f"{'':<11} {'base':>8}{'spec':>8}{'gw':>8} {'base':>7}{'spec':>7}{'gw':>6} {'':>7} "
        f"{'spec':>8}{'gw':>8}"
    )
    lines = [head, sub]
    for row in rows:
        base = row.mean_e2e("baseline")
        accept = f"{row.acceptance:.2f}" if row.acceptance is not None else "-"
        lines.append(
            f"{row.workload:<11} {row.p50('baseline'):>8.3f}{row.p50('speculative'):>8.3f}"
            f"{row.p50('gateway'):>8.3f} {row.tokens_per_s('baseline'):>7.0f}"
            f"{row.tokens_per_s('speculative'):>7.0f}{row.tokens_per_s('gateway'):>6.0f} "
            f"{accept:>7} "
            f"{base / row.mean_e2e('speculative'):>7.2f}x{base / row.mean_e2e('gateway'):>7.2f}x  "
            f"{row.routes()}"
        )
    total = {t: sum(r.mean_e2e(t) for r in rows) for t in TARGETS}
    oracle = sum(r.oracle() for r in rows)
    lines.append(
        f"\nmean e2e over the mix: baseline {total['baseline']:.3f}s, speculative "
        f"{total['speculative']:.3f}s, gateway {total['gateway']:.3f}s, per-request oracle "
        f"{oracle:.3f}s -> gateway/oracle {total['gateway'] / oracle:.2f}"
    )
    lines.append("accept = accepted / proposed draft tokens, from vLLM's spec_decode counters")
    return "\n".join(lines)


class Progress:
    """A live counter on a terminal; one line per finished phase in a log."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.done = label, total, 0
        self.live = sys.stderr.isatty()
        self._show()

    def tick(self, _: Result) -> None:
        self.done += 1
        self._show()

    def _show(self) -> None:
        if self.live:
            line = f"\r[EMULATED] {self.label:<28} {self.done:>3}/{self.total}"
            print(line, end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        end = "\r" + " " * 45 + "\r" if self.live else ""
        if not self.live:
            print(f"[EMULATED] {self.label}: {self.done}/{self.total} done", file=sys.stderr)
        print(end, end="", file=sys.stderr, flush=True)
