"""`specroute demo`: the no-GPU main job, on EMULATED backends.

Starts two emulated vLLM servers (speculative and baseline, GPU-shaped timing)
and the gateway in one process. The gateway starts from neutral priors (it is
not told the emulator's truth); with --warmup N, first N requests per workload
of the same mix, with other prompts, go through the gateway alone and what it
learned is printed (routes and believed acceptance per workload). Then a short
`specroute bench` of the demo mix runs through the baseline directly, the
speculative server directly and the gateway: per workload what each route
gave, what the gateway chose, and its regret against the per-request oracle.
It is the bench's core with fixed choices, so the two can never disagree about
a figure.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
import time
from typing import Any, TextIO

import aiohttp

from gateway.commands import Help
from tooling.bench import BenchOptions, run_bench
from tooling.bench.targets import wait_for_profile
from tooling.emulator.config import DEFAULT_GPU_PROFILE, add_gpu_arguments
from tooling.emulator.costs import describe_gpu, gpu_name
from tooling.local_stack import local_stack
from tooling.workloads import MIXES

HELP = Help(
    "no-GPU demo: EMULATED backends, the gateway, a short mixed workload",
    "Start two EMULATED vLLM servers and the gateway in one process, then bench the demo "
    "mix through the baseline, the speculative server and the gateway: per workload what "
    "each route gave, what the gateway chose, and its regret against the per-request "
    "oracle. The figures are the emulator's modelled timing, not a GPU's.",
    (
        "specroute demo",
        "specroute demo --warmup 8 --requests 12 --gpu-profile h200-qwen3-32b",
    ),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=6, help="requests per workload and target")
    p.add_argument("--concurrency", type=int, default=2, help="requests in flight per target")
    p.add_argument("--time-scale", type=float, default=0.5, help="emulator time scale")
    add_gpu_arguments(p)
    p.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="requests per workload the gateway learns from before the measured run (0: none)",
    )


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from gateway.telemetry import configure_logging

    configure_logging("warning")
    return asyncio.run(
        run_demo(
            per_workload=args.requests,
            concurrency=args.concurrency,
            time_scale=args.time_scale,
            warmup=args.warmup,
            gpu_profile=args.gpu_profile,
            drafter=args.drafter,
        )
    )


async def run_demo(
    *,
    per_workload: int,
    concurrency: int,
    time_scale: float,
    warmup: int = 0,
    gpu_profile: str = DEFAULT_GPU_PROFILE,
    drafter: str = "draft-1b",
    out: TextIO = sys.stdout,
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
    async with local_stack(
        time_scale=time_scale, gpu_profile=gpu_profile, drafter=drafter
    ) as stack:
        print(f"[EMULATED] timing from the {describe_gpu(stack.emulator)}", file=out, flush=True)
        await wait_for_profile(aiohttp.ClientSession, stack.gateway, out)
        if warmup > 0:
            await _warm_up(stack.gateway, warmup, concurrency, out)
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
    sent = warmup * len(names) if warmup > 0 else 0
    sent += sum(len(run["results"]) for c in outcome.doc["cells"] for run in c["runs"].values())
    print(
        f"\n[EMULATED] {sent} requests in {time.perf_counter() - started:.1f} s, "
        f"{outcome.failures} failed. Figures are from the emulator's modelled timing, "
        f"not a real GPU (they model the measured {gpu_name(gpu_profile)}). "
        "`specroute bench --emulate` runs more of it; "
        "`specroute advise` reads its --json.",
        file=out,
    )
    return 1 if outcome.failures else 0


async def _warm_up(gateway: str, per_workload: int, concurrency: int, out: TextIO) -> None:
    """The gateway alone serves the demo mix with other prompts (seed 1), and learns.

    Its table is not printed (nothing to compare it with); what the gateway made
    of it is: routes and believed acceptance per workload, beside the acceptance
    the speculative server reported for them."""
    print(
        f"\nwarm-up: {per_workload} requests per workload through the gateway alone "
        "(other prompts; not measured); what it learned:",
        file=out,
        flush=True,
    )
    opts = BenchOptions(
        targets={"gateway": gateway},
        workload="demo",
        concurrency=[concurrency],
        requests=per_workload,
        seed=1,
        command=["specroute", "demo", "warm-up"],
    )
    await run_bench(opts, out=io.StringIO(), tag="demo warm-up")
    async with aiohttp.ClientSession() as session, session.get(f"{gateway}/stats") as resp:
        stats: dict[str, Any] = await resp.json()
    order = [r["name"] for r in stats["routes"]]  # the configured routes, in order
    print(
        f"  {'workload':<14}{'/'.join(order):>22}  believed/measured acceptance per "
        "speculative route (accepted/proposed drafts)",
        file=out,
    )
    for name, w in stats["workloads"].items():
        routes = w["requests"]
        if not sum(routes.values()):
            continue
        counts = "/".join(str(routes.get(r, 0)) for r in order)
        acc = "  ".join(
            f"{route} {_rate(a['believed_rate'])}/{_rate(a['measured_rate'])}"
            for route, a in w["acceptance"].items()
        )
        print(f"  {name:<14}{counts:>22}  {acc}", file=out)
    print(file=out, flush=True)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
