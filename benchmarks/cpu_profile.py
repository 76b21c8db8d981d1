"""Where one request's CPU goes in `specroute serve`: py-spy samples put in stages.

    .venv/bin/python benchmarks/cpu_profile.py                      # two routes, c=32
    .venv/bin/python benchmarks/cpu_profile.py --tracing --stream   # OTLP to a local sink
    .venv/bin/python benchmarks/cpu_profile.py --tree /tmp/old      # another checkout's gateway

The gateway (CPU 1) sits in front of one EMULATED upstream at a negligible time scale
(CPU 0, with this load generator): non-streamed chat with max_tokens 1 unless --stream.
py-spy records the gateway while `--n` requests run at c=32. Each sample goes to the
stage of its deepest frame that names one (`STAGES`: a sample in aiohttp's client under
`open_upstream` is the proxy's); one with no stage above it is the event loop's. A
stage's microseconds are its share of the samples times the gateway's own CPU per
request (user + system from /proc over the same run). Figures printed, nothing asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.extproc_overhead import _TICKS, environ, otlp_sink, routes_config  # noqa: E402
from benchmarks.overhead import CHAT, emulate, free_port, latencies, process  # noqa: E402
from tooling.bench.targets import wait_for_profile  # noqa: E402
from tooling.local_stack import wait_healthy  # noqa: E402

# (stage, what a frame's text holds), tried on each frame from the deepest up.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "background: scrapes, health probes",
        ("gateway/backends/scraper.py", "scrape_all ", "_scrape ", "probe_all ", "_probe "),
    ),
    ("tracing: spans and context", ("gateway/wire/tracing.py", "opentelemetry/")),
    ("log line", ("log_request ", "structlog/")),
    ("metrics", ("count_request ", "prometheus_client/")),
    (
        "learn, shadows, outcome log",
        ("gateway/outcomes/learning.py", "outcome_line ", "gateway/shadow/", "saw_answer "),
    ),
    (
        "decide (policy, live state, model filter)",
        (
            "classifier/router",
            "classifier/cost",
            "classifier/beliefs",
            "classifier/guards",
            "classifier/types",
            "gateway/backends/live.py",
            "gateway/backends/models.py",
            "steer_to_model ",
            "live_state ",
            "decide ",
            "Pair.state ",
            "Backend.state ",
            "endpoints_state ",
            "choose_pair ",
        ),
    ),
    ("features and tokenization", ("classifier/features.py", "classifier/tokens.py", "tiktoken")),
    ("read and parse the body", ("gateway/wire/validation.py", "_read_json_body ")),
    ("proxy: the call to the backend", ("open_upstream ",)),
    (
        "relay: read the answer, write it to the client",
        (
            "relay ",
            "_relay_",
            "_send_whole ",
            "read_chat_events ",
            "loads_object ",
            "_stream (gateway/wire",
        ),
    ),
    (
        "dispatch, request record, middlewares",
        (
            "gateway/request/",
            "gateway/wire/life.py",
            "gateway/errors.py",
            "gateway/auth.py",
            "gateway/api/",
            "gateway/backends/pool.py",
        ),
    ),
)
LOOP = "event loop, HTTP server and client protocols"
OTHER_THREADS = "other threads (tracing: the exporter's)"
STAGE_ORDER = [stage for stage, _ in STAGES] + [LOOP]


def stage_of(stack: str) -> str:
    """The stage of one sample: `stack` is py-spy's raw line, root first, frames `;`-joined."""
    frames = stack.split(";")
    if "threading.py" in frames[0]:  # py-spy samples every thread; the table has them apart
        return OTHER_THREADS
    for frame in reversed(frames):
        for stage, marks in STAGES:
            if any(mark in frame for mark in marks):
                return stage
    return LOOP


def shares(raw: str) -> Counter[str]:
    """Samples per stage from a py-spy `--format raw` file's text."""
    out: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out[stage_of(stack)] += int(count)
    return out


@dataclass
class Profile:
    """One profiled run: samples per stage, and the gateway's CPU per request (ms) in
    the thread the samples are of and in its other threads (the exporter's)."""

    samples: Counter[str]
    cpu_ms: float
    other_threads_ms: float
    rps: float


def thread_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of a process's main thread and of its other threads (Linux /proc)."""
    main = others = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        used = (int(fields[11]) + int(fields[12])) / _TICKS
        if task.name == str(pid):
            main = used
        else:
            others += used
    return main, others


async def run(args: argparse.Namespace) -> Profile:
    """Samples per stage, CPU per request and req/s, over one profiled run."""
    py, tree = sys.executable, args.tree.resolve()
    up_port, gw_port = free_port(), free_port()
    upstream, gateway = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{gw_port}"
    serve = ["gateway.cli", "serve", "--port", str(gw_port)]
    if args.routes == 2:
        serve += ["--backend", f"speculative={upstream}", "--backend", f"baseline={upstream}"]
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    with tempfile.TemporaryDirectory() as tmp:
        if args.routes != 2:
            serve += ["--config", str(routes_config(args.routes, upstream, Path(tmp) / "r.toml"))]
        out = args.raw or Path(tmp) / "stacks.txt"
        out.unlink(missing_ok=True)
        if args.py_spy:
            argv = [py, "-m", *serve]
        else:
            argv = [py, str(ROOT / "benchmarks" / "cpu_sampler.py"), str(out), "0.001", *serve]
        with process(emulate(up_port), cpu=0):
            await wait_healthy(upstream)
            async with otlp_sink() as sink:
                env = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink} if args.tracing else {}
                with environ(**env), process(argv, cpu=1, cwd=tree) as gw:
                    await wait_healthy(gateway, timeout_s=120)
                    await wait_for_profile(
                        aiohttp.ClientSession, gateway, sys.stderr, timeout_s=600
                    )
                    await latencies(gateway, 300, 8, body=_body(args))  # warm
                    async with _sampling(gw.pid, out, args):
                        before = thread_cpu_s(gw.pid)
                        _, rps = await latencies(gateway, args.n, 32, body=_body(args))
                        after = thread_cpu_s(gw.pid)
        main, others = ((a - b) / args.n * 1e3 for a, b in zip(after, before, strict=True))
        return Profile(shares(out.read_text()), main, others, rps)


def _written(out: Path) -> bool:
    return out.exists() and out.stat().st_size > 0


@asynccontextmanager
async def _sampling(pid: int, out: Path, args: argparse.Namespace) -> AsyncIterator[None]:
    """Samples taken while the body runs: py-spy attached, or the CPU sampler told."""
    if not args.py_spy:
        os.kill(pid, signal.SIGUSR1)
        yield
        os.kill(pid, signal.SIGUSR2)
        for _ in range(100):  # it writes the file at its next bytecode
            if _written(out):
                return
            await asyncio.sleep(0.05)
        return
    spy = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("py-spy")),
        *("record", "--pid", str(pid), "--format", "raw", "--rate", "500", "--nonblocking"),
        *("-o", str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    await asyncio.sleep(1.0)  # attached
    yield
    spy.send_signal(signal.SIGINT)
    await asyncio.wait_for(spy.wait(), 60)


def _body(args: argparse.Namespace) -> dict[str, object]:
    if not args.stream:
        return CHAT
    return {**CHAT, "max_tokens": 32, "stream": True}


def table(profile: Profile) -> list[str]:
    """Each stage's share of the CPU per request and its microseconds: the main thread's
    samples times its CPU; the other threads' CPU (the exporter's, tracing on) as one row."""
    samples, whole = profile.samples, profile.cpu_ms + profile.other_threads_ms
    total = sum(samples.values()) or 1
    us = {stage: samples.get(stage, 0) / total * profile.cpu_ms * 1e3 for stage in STAGE_ORDER}
    us[OTHER_THREADS] = profile.other_threads_ms * 1e3
    rows = ["| stage | share | us/request |", "|---|---|---|"]
    rows += [f"| {stage} | {us[stage] / (whole * 1e3):.0%} | {us[stage]:,.0f} |" for stage in us]
    rows.append(f"| **CPU per request** | | **{whole * 1e3:,.0f}** |")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=3000, help="requests profiled at c=32")
    parser.add_argument("--routes", type=int, default=2, help="routes, all on the one upstream")
    parser.add_argument(
        "--py-spy",
        action="store_true",
        help="sample with py-spy (wall time of a runnable thread) instead",
    )
    parser.add_argument("--tracing", action="store_true", help="OTLP spans to a local sink")
    parser.add_argument("--stream", action="store_true", help="streamed chat, 32 tokens")
    parser.add_argument("--tree", type=Path, default=ROOT, help="run this checkout's gateway")
    parser.add_argument("--raw", type=Path, help="keep py-spy's raw stacks here")
    args = parser.parse_args()
    profile = asyncio.run(run(args))
    print("\n".join(table(profile)))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"{sum(profile.samples.values())} samples, {profile.rps:.0f} req/s at c=32, "
        f"load average {load}"
    )
