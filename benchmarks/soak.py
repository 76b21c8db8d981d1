"""Soak: mixed traffic with injected faults through the gateway, bounded in time.

    .venv/bin/python benchmarks/soak.py --duration 180      # a few minutes
    .venv/bin/python benchmarks/soak.py --duration 20       # smoke (CI)

Loopback only. Two EMULATED vLLM servers run as subprocesses (so they can be
killed and restarted); the gateway runs in this process under the production
runner settings, next to the load generator. Clients send streams and whole
answers (clients 1 and 5 of every 8 name a route with x-specroute-route; one
stream in ten is left mid-way), a probe every second measures the queue wait,
and the events of issue 16's chaos test (tests/gateway/test_chaos.py; tooling/chaos.py
holds what both run) come round in turn, one every 3 s:
- the speculative backend is killed (SIGKILL) and restarted 2 s later;
- the baseline backend stalls mid-stream for 0.5 s on a few requests (slow);
- the baseline backend is killed and restarted 2 s later;
- the baseline answers 500 until the gateway ejects it, then recovers, and the
  speculative backend is killed (the ejected one is all there is);
- the baseline's engine is filled with streams nobody reads (a full queue);
- two senders post 4 MB bodies while /health is timed.
Every request is classified: ok, left on purpose, broken mid-stream by a
backend kill (bytes were already sent, so no retry is possible: the client got
an error event and [DONE]), or failed. A failure counts against the gateway
when a backend answered /health at that moment (the soak's own poller); the
run exits non-zero if there is any, if a stream did not end with [DONE], if
RSS grew past the bound, if asyncio tasks did not return to their baseline,
or if a ResourceWarning was raised. The worst queue wait (a probe's time to
first token over its unloaded time) and /health p99 under the flood are
printed; the chaos test asserts them, with the load around them controlled.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import sys
import time
import warnings
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import aiohttp
import structlog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from classifier.types import PAIR, Route  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.telemetry import configure_logging  # noqa: E402
from tooling.chaos import (  # noqa: E402
    Action,
    Chaos,
    EmulatedBackend,
    Flood,
    Load,
    Sent,
    Timeline,
    Watch,
    figure_lines,
    flood,
    flood_body,
    gateway_config,
    gateway_rotation,
    run_load,
    run_probes,
    run_schedule,
    summarize,
    unloaded_ttft,
)
from tooling.local_stack import serve_app  # noqa: E402

TIME_SCALE = 0.1
EVERY_S = 3.0  # one event every 3 s (a long one delays the next)
STALLED = 3  # answers per stall

GATEWAY_ERRORS: list[str] = []


def _count_errors(
    logger: object, method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Every error the gateway logs is a bug the soak found (the client saw nothing)."""
    if method in ("error", "exception", "critical"):
        GATEWAY_ERRORS.append(str(event.get("event")))
    return event


def _keep_resource_warnings(out: list[str]) -> Callable[..., None]:
    """A showwarning that keeps each ResourceWarning as text: a recorded WarningMessage
    holds its `source` (aiohttp's is the whole request body), which would count in RSS."""

    def show(
        message: Warning | str, category: type[Warning], filename: str, lineno: int, *rest: object
    ) -> None:
        if issubclass(category, ResourceWarning):
            out.append(f"ResourceWarning: {filename}:{lineno}: {message}")

    return show


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def events(chaos: Chaos, floods: list[Flood], bodies: list[bytes]) -> list[Action]:
    """One round of issue 16's events (the soak repeats it until its time is up)."""
    spec, base = Route.SPECULATIVE, Route.BASELINE

    async def flood_event() -> None:
        floods.append(await chaos.flood(2.0, bodies))

    return [
        lambda: chaos.kill_restart(spec, 2.0),
        lambda: chaos.stall(base, stall_s=0.5, requests=STALLED, hold_s=1.0),
        lambda: chaos.kill_restart(base, 2.0),
        lambda: chaos.eject_then_kill(base, down_s=2.0),
        lambda: chaos.saturate(base, hold_s=2.0),
        flood_event,
    ]


async def soak(duration: float, concurrency: int, seed: int, rss_bound_mb: float) -> int:
    backends = {
        route: EmulatedBackend(
            route, time_scale=TIME_SCALE, max_num_seqs=concurrency + 8, seed=seed
        )
        for route in PAIR
    }
    for backend in backends.values():
        backend.start()
    config = gateway_config(
        backends,
        health_interval_s=0.5,
        scrape_interval_s=1.0,
        read_timeout_s=5.0,
        eject_after_failures=2,
        eject_s=2.0,
    )
    app = create_app(config)
    runner, gateway = await serve_app(app)
    sent: list[Sent] = []
    floods: list[Flood] = []
    bodies = [flood_body(seed + i) for i in range(2)]
    watch = Watch(backends.values())
    resource_warnings: list[str] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", ResourceWarning)
            warnings.showwarning = _keep_resource_warnings(resource_warnings)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                await asyncio.gather(*(b.ready() for b in backends.values()))
                unloaded_s = await unloaded_ttft(session, gateway)  # and the warm-up
                await flood(gateway, 0.1, bodies)  # RSS is measured from past its high water
                watching = asyncio.create_task(watch.run())
                gc.collect()
                rss_start, tasks_start = rss_mb(), len(asyncio.all_tasks())
                timeline = Timeline()
                chaos = Chaos(backends, timeline, session, gateway_rotation(app), gateway, sent)
                rounds = itertools.cycle(events(chaos, floods, bodies))
                steps = [
                    (at_s, next(rounds))
                    for at_s in itertools.takewhile(
                        lambda at: at < duration - 2.0, itertools.count(2.0, EVERY_S)
                    )
                ]
                load = Load(concurrency, leave_share=0.1, timeout_s=60.0, seed=seed)
                async with asyncio.TaskGroup() as tg:
                    end = timeline.t0 + duration
                    running = lambda: time.monotonic() < end  # noqa: E731
                    tg.create_task(run_load(session, gateway, load, running, sent))
                    tg.create_task(run_probes(session, gateway, running, 1.0, sent))
                    tg.create_task(run_schedule(timeline.t0, steps))
                watching.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watching
            await asyncio.sleep(0.5)
            gc.collect()
            rss_end, tasks_end = rss_mb(), len(asyncio.all_tasks())
    finally:
        await runner.cleanup()
        for backend in backends.values():
            backend.kill()
    figures = summarize(sent, timeline, watch, unloaded_s)
    worst_flood = max(floods, key=lambda f: f.p99_ms, default=None)
    v = figures.verdicts
    failed = len(figures.failed_with_healthy)
    left = sum(s.kind == "load" and s.ending == "left" for s in sent)
    print(f"soak: {duration:.0f} s, {concurrency} clients, EMULATED backends (loopback)")
    print(
        f"  requests {figures.requests}: ok {v['ok']}, disconnected on purpose "
        f"{v['left on purpose']}, broken mid-stream by a backend kill {v['broken by a kill']}, "
        f"FAILED {failed} (and {len(figures.failed_without_healthy)} with no backend up)"
    )
    names = [e.name for e in timeline.events]
    print(
        f"  faults injected: {names.count('kill')} backend kills+restarts, "
        f"{names.count('stall') * STALLED} stalled streams, {left} client disconnects, "
        f"{names.count('eject')} ejections, {names.count('saturate')} saturated queues, "
        f"{names.count('flood')} floods of 4 MB bodies"
    )
    for line in figure_lines(figures, timeline, worst_flood)[1:]:  # its requests are above
        print(f"  {line}")
    print(
        f"  RSS {rss_start:.1f} MB -> {rss_end:.1f} MB ({rss_end - rss_start:+.1f} MB, bound "
        f"{rss_bound_mb} MB); asyncio tasks {tasks_start} -> {tasks_end}; "
        f"ResourceWarnings {len(resource_warnings)}; gateway errors logged {len(GATEWAY_ERRORS)}"
    )
    for line in sorted(set(resource_warnings)):
        print(f"  {resource_warnings.count(line)}x {line}")
    bad = (
        failed > 0
        or bool(figures.bad_streams)
        or rss_end - rss_start > rss_bound_mb
        or tasks_end > tasks_start
        or bool(resource_warnings)
        or bool(GATEWAY_ERRORS)
    )
    worst = round(figures.worst_wait.ratio, 2) if figures.worst_wait else None
    print(
        json.dumps(
            {
                "ok": not bad,
                "requests": figures.requests,
                "failed": failed,
                "failed_with_no_backend_up": len(figures.failed_without_healthy),
                "bad_streams": len(figures.bad_streams),
                "events": len(timeline.events),
                "worst_wait_ratio": worst,
                "health_p99_ms_under_flood": round(worst_flood.p99_ms, 1) if worst_flood else None,
                "gateway_errors": len(GATEWAY_ERRORS),
                "rss_start_mb": round(rss_start, 1),
                "rss_end_mb": round(rss_end, 1),
            }
        )
    )
    return 1 if bad else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=180.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rss-bound-mb", type=float, default=30.0)
    args = parser.parse_args()
    configure_logging("error")  # one JSON line per request would drown the figures
    structlog.configure(processors=[_count_errors, *structlog.get_config()["processors"]])
    sys.exit(asyncio.run(soak(args.duration, args.concurrency, args.seed, args.rss_bound_mb)))
