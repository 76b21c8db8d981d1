"""`specroute demo`: the no-GPU main job, on EMULATED backends.

Starts two emulated vLLM servers (speculative and baseline, GPU-shaped timing)
and the gateway in one process and runs a short `specroute bench` of the demo
mix through the baseline directly, the speculative server directly and the
gateway: per workload what each route gave, what the gateway chose, and its
regret against the per-request oracle. It is the bench's core with fixed
choices, so the two can never disagree about a figure.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import TextIO

from tooling.bench import BenchOptions, run_bench
from tooling.local_stack import local_stack
from tooling.workloads import MIXES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=6, help="requests per workload and target")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--time-scale", type=float, default=0.5, help="emulator time scale")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from gateway.telemetry import configure_logging

    configure_logging("warning")
    return asyncio.run(
        run_demo(
            per_workload=args.requests, concurrency=args.concurrency, time_scale=args.time_scale
        )
    )


async def run_demo(
    *, per_workload: int, concurrency: int, time_scale: float, out: TextIO = sys.stdout
) -> int:
    names = MIXES["demo"]
    print(
        "specroute demo: EMULATED backends (specroute emulate: vLLM's API and metrics, "
        "modelled GPU timing, no model runs)\n"
        f"{len(names)} workloads x {per_workload} requests x 3 targets, "
        f"concurrency {concurrency}, time scale {time_scale}",
        file=out,
        flush=True,
    )
    started = time.perf_counter()
    async with local_stack(time_scale=time_scale) as stack:
        opts = BenchOptions(
            targets={
                "baseline": stack.baseline,
                "speculative": stack.speculative,
                "gateway": stack.gateway,
            },
            workload="demo",
            concurrency=[concurrency],
            requests=per_workload,
            command=["specroute", "demo"],
        )
        outcome = await run_bench(opts, out=out, tag="demo")
    sent = sum(len(run["results"]) for c in outcome.doc["cells"] for run in c["runs"].values())
    print(
        f"\n[EMULATED] {sent} requests in {time.perf_counter() - started:.1f} s, "
        f"{outcome.failures} failed. Figures are from the emulator's modelled timing, "
        "not a real GPU. `specroute bench --emulate` runs more of it; "
        "`specroute advise` reads its --json.",
        file=out,
    )
    return 1 if outcome.failures else 0
