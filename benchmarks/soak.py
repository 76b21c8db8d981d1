"""Soak: mixed traffic with injected faults through the gateway, bounded in time.

    .venv/bin/python benchmarks/soak.py --duration 180      # a few minutes
    .venv/bin/python benchmarks/soak.py --duration 20       # smoke (CI)

Loopback only. Two EMULATED vLLM servers run as subprocesses (so they can be
killed and restarted); the gateway runs in this process under the production
runner settings, next to the load generator. Faults, on a schedule:
- the speculative backend is killed (SIGKILL) and restarted 2 s later;
- the baseline backend stalls mid-stream for 0.5 s on a few requests (slow);
- one client in ten disconnects mid-stream.
Every request is classified: ok, disconnected on purpose, broken mid-stream by
a backend kill (bytes were already sent, so no retry is possible), or failed.
A failure is a request that had a healthy backend available and still did not
get a complete answer; the run exits non-zero if there is any, if RSS grew
past the bound, if asyncio tasks did not return to their baseline, or if a
ResourceWarning was raised.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import signal
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.app import create_app  # noqa: E402
from gateway.config import parse_config  # noqa: E402
from gateway.telemetry import configure_logging  # noqa: E402
from tooling.local_stack import wait_healthy  # noqa: E402
from tooling.workloads import build  # noqa: E402

MODEL = "emulated-model"


GATEWAY_ERRORS: list[str] = []


def _count_errors(logger: object, method: str, event: dict[str, object]) -> dict[str, object]:
    """Every error the gateway logs is a bug the soak found (the client saw nothing)."""
    if method in ("error", "exception", "critical"):
        GATEWAY_ERRORS.append(str(event.get("event")))
    return event


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Backend:
    """One emulated vLLM server as a subprocess that can be killed and restarted."""

    def __init__(self, mode: str, time_scale: float) -> None:
        self.mode, self.port = mode, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            sys.executable,
            "-m",
            "gateway.cli",
            "emulate",
            "--mode",
            mode,
            "--port",
            str(self.port),
            "--model",
            MODEL,
            "--time-scale",
            str(time_scale),
        ]
        if mode == "speculative":
            self.args += ["--per-request-spec-decode-metrics", "summary"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.down_since: float | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.down_since = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.down_since = time.monotonic()

    async def ready(self, session: aiohttp.ClientSession) -> None:
        await wait_healthy(self.url)


@dataclass
class Tally:
    ok: int = 0
    disconnected: int = 0
    broken_by_kill: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)
    kills: int = 0
    stalls: int = 0


async def one_request(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, object],
    path: str,
    disconnect: bool,
    spec: Backend,
    tally: Tally,
) -> None:
    body = {**body, "stream": True}
    complete = errored = False
    route = None
    events = 0
    try:
        async with session.post(f"{url}{path}", json=body) as resp:
            route = resp.headers.get("x-specroute-route")
            if resp.status != 200:
                tally.failed += 1
                tally.failures.append(f"status {resp.status}: {(await resp.read())[:160]!r}")
                return
            async for line in resp.content:
                if line.startswith(b"data: [DONE]"):
                    complete = True
                elif line.startswith(b'data: {"error"'):
                    errored = True
                elif line.startswith(b"data: {"):
                    events += 1
                    if disconnect and events == 3:
                        tally.disconnected += 1
                        return  # leaving the block closes the connection mid-stream
    except (aiohttp.ClientError, TimeoutError) as exc:
        tally.failed += 1
        tally.failures.append(f"{type(exc).__name__}: {exc}")
        return
    if complete and not errored:
        tally.ok += 1
    elif errored and route == "speculative" and spec.down_since is not None:
        tally.broken_by_kill += 1  # bytes were sent when its backend died: no retry possible
    else:
        tally.failed += 1
        tally.failures.append(f"incomplete stream via {route} after {events} events")


async def soak(duration: float, concurrency: int, seed: int, rss_bound_mb: float) -> int:
    rng = random.Random(seed)
    spec, base = Backend("speculative", 0.1), Backend("baseline", 0.1)
    spec.start()
    base.start()
    config = parse_config(
        {
            "backends": {"speculative": {"urls": [spec.url]}, "baseline": {"urls": [base.url]}},
            "upstream": {
                "health_interval_s": 0.5,
                "scrape_interval_s": 1.0,
                "read_timeout_s": 5.0,
                "eject_after_failures": 2,
                "eject_s": 2.0,
            },
        }
    )
    runner = web.AppRunner(create_app(config), handler_cancellation=True, access_log=None)
    await runner.setup()
    gw_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", gw_port).start()
    gateway = f"http://127.0.0.1:{gw_port}"
    tally = Tally()
    requests = build(["structured", "sql", "code", "creative", "chat"], 400, model=MODEL, seed=seed)
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                await spec.ready(session)
                await base.ready(session)
                for r in requests[:10]:  # warm up
                    await one_request(session, gateway, r.body, r.path, False, spec, Tally())
                gc.collect()
                rss_start, tasks_start = rss_mb(), len(asyncio.all_tasks())
                deadline = time.monotonic() + duration
                next_kill = time.monotonic() + 4.0
                next_stall = time.monotonic() + 2.5
                sent = 0

                async def worker(worker_id: int) -> None:
                    nonlocal sent
                    while time.monotonic() < deadline:
                        r = requests[sent % len(requests)]
                        sent += 1
                        await one_request(
                            session, gateway, r.body, r.path, rng.random() < 0.1, spec, tally
                        )

                workers = [asyncio.create_task(worker(i)) for i in range(concurrency)]
                while time.monotonic() < deadline:
                    now = time.monotonic()
                    if now >= next_kill:
                        spec.kill()
                        tally.kills += 1
                        await asyncio.sleep(2.0)
                        spec.start()
                        await spec.ready(session)
                        next_kill = time.monotonic() + 6.0
                    elif now >= next_stall:
                        fault = {"stall_s": 0.5, "stall_after_chunks": 2, "fault_limit": 3}
                        async with session.post(f"{base.url}/emulator/faults", json=fault) as resp:
                            await resp.read()
                        tally.stalls += 3
                        next_stall = now + 3.0
                    await asyncio.sleep(0.1)
                await asyncio.gather(*workers)
            await asyncio.sleep(0.5)
            gc.collect()
            rss_end, tasks_end = rss_mb(), len(asyncio.all_tasks())
    finally:
        await runner.cleanup()
        spec.kill()
        base.kill()
    resource_warnings = [w for w in caught if issubclass(w.category, ResourceWarning)]
    total = tally.ok + tally.disconnected + tally.broken_by_kill + tally.failed
    print(f"soak: {duration:.0f} s, {concurrency} clients, EMULATED backends (loopback)")
    print(
        f"  requests {total}: ok {tally.ok}, disconnected on purpose {tally.disconnected}, "
        f"broken mid-stream by a backend kill {tally.broken_by_kill}, FAILED {tally.failed}"
    )
    print(
        f"  faults injected: {tally.kills} backend kills+restarts, {tally.stalls} stalled "
        f"streams, {tally.disconnected} client disconnects"
    )
    print(
        f"  RSS {rss_start:.1f} MB -> {rss_end:.1f} MB ({rss_end - rss_start:+.1f} MB, bound "
        f"{rss_bound_mb} MB); asyncio tasks {tasks_start} -> {tasks_end}; "
        f"ResourceWarnings {len(resource_warnings)}; gateway errors logged {len(GATEWAY_ERRORS)}"
    )
    for failure in tally.failures[:10]:
        print(f"  failure: {failure}")
    bad = (
        tally.failed > 0
        or rss_end - rss_start > rss_bound_mb
        or tasks_end > tasks_start
        or bool(resource_warnings)
        or bool(GATEWAY_ERRORS)
    )
    print(
        json.dumps(
            {
                "ok": not bad,
                "requests": total,
                "failed": tally.failed,
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
