"""What the gateway costs: the same load sent directly and through it, in one run.

    .venv/bin/python benchmarks/overhead.py            # full run (a few minutes)
    .venv/bin/python benchmarks/overhead.py --smoke    # small counts (CI)

The upstream is an EMULATED vLLM server at a negligible time scale, so what is
measured is HTTP and the gateway, not a model. Processes: the emulated
upstream and this load generator share CPU 0, the gateway (`specroute serve`,
production settings) has CPU 1; on a 2-core machine that is the fairest split
(the direct path's client and server share a core in both cases). The gateway
runs the default profiled policy and profiles the upstream at start; nothing is
timed until that profile is in (its probes would be measured as overhead).
Figures are ratios and differences from one run, printed; nothing here asserts
a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tooling.bench.targets import wait_for_profile  # noqa: E402
from tooling.local_stack import wait_healthy  # noqa: E402

CHAT = {"model": "emulated-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def process(
    args: list[str], cpu: int | None, cwd: Path = ROOT
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if (
        cpu is not None
        and hasattr(os, "sched_setaffinity")
        and os.cpu_count()
        and os.cpu_count() > cpu
    ):  # type: ignore[operator]
        os.sched_setaffinity(proc.pid, {cpu})
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def latencies(
    url: str, n: int, concurrency: int, body: dict[str, object] = CHAT
) -> tuple[list[float], float]:
    """Per-request seconds and requests/s, `concurrency` in flight (non-streamed chat
    unless `body` says otherwise)."""
    out: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        remaining = n

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                t = time.perf_counter()
                async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                    await resp.read()
                    assert resp.status == 200, resp.status
                out.append(time.perf_counter() - t)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return out, n / elapsed


async def paced(url: str, n: int, rate: float) -> list[float]:
    """Per-request seconds with requests started at a fixed rate (open loop)."""
    out: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(delay: float) -> None:
            await asyncio.sleep(delay)
            t = time.perf_counter()
            async with session.post(f"{url}/v1/chat/completions", json=CHAT) as resp:
                await resp.read()
            out.append(time.perf_counter() - t)

        await asyncio.gather(*(one(i / rate) for i in range(n)))
    return out


async def stream_rate(url: str, tokens: int, streams: int) -> tuple[float, float]:
    """Chunks per second over `streams` concurrent long streams, and mean inter-chunk gap."""
    body = {**CHAT, "max_tokens": tokens, "stream": True, "stream_options": {"include_usage": True}}
    gaps: list[float] = []
    chunks = 0
    async with aiohttp.ClientSession() as session:

        async def one() -> None:
            nonlocal chunks
            async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                last = time.perf_counter()
                async for line in resp.content:
                    if line.startswith(b"data: "):
                        now = time.perf_counter()
                        gaps.append(now - last)
                        last = now
                        chunks += 1

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(streams)))
        elapsed = time.perf_counter() - started
    return chunks / elapsed, statistics.fmean(gaps)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def decision_cost(samples: int) -> list[tuple[str, float, float]]:
    """Features + ProfiledPolicy.decide on a GPU-shaped profile (the built-in prior's
    curves, as measured: reason not "unprofiled"), with the gateway's rng (a draw)."""
    import dataclasses
    import random

    from classifier import Endpoint, ProfiledPolicy, RouterConfig, extract_features
    from classifier.cost import prior_profile
    from classifier.tokens import load_tiktoken_counter
    from classifier.types import BackendState, LiveState, two_routes

    counter = load_tiktoken_counter()
    profile = dataclasses.replace(prior_profile(two_routes(4, 0.1)), source="emulated")
    policy = ProfiledPolicy(RouterConfig(), routes=two_routes(4, 0.1), profile=profile)
    rng = random.Random(0)
    state = LiveState.pair(BackendState(inflight=2), BackendState(inflight=1))
    words = [
        "the",
        "quarterly",
        "report",
        "lists",
        "revenue",
        "by",
        "region",
        "and",
        "product",
        "line",
    ]
    rows = []
    for label, n_words in (("200-token", 180), ("2k-token", 1800), ("8k-token", 7200)):
        times = []
        for i in range(samples):
            # a new text every time: no cache can help
            text = f"{i} " + " ".join(words[(i + j) % len(words)] for j in range(n_words))
            body = {"messages": [{"role": "user", "content": text}], "temperature": 0}
            t = time.perf_counter()
            features = extract_features(body, Endpoint.CHAT, counter)
            policy.decide(features, state, rng)
            times.append(time.perf_counter() - t)
        rows.append((label, pct(times, 0.5) * 1e6, pct(times, 0.99) * 1e6))
    return rows


def emulate(port: int, time_scale: str = "0.000001") -> list[str]:
    """The EMULATED upstream's command: at the default time scale, about zero model time."""
    return [
        sys.executable,
        "-m",
        "gateway.cli",
        "emulate",
        "--mode",
        "baseline",
        "--port",
        str(port),
        "--time-scale",
        time_scale,
        "--max-num-seqs",
        "512",
        "--model",
        "emulated-model",
    ]


async def main(smoke: bool) -> dict[str, object]:
    n1, n64, sat, streams, tokens, rss_n = (
        (50, 256, 512, 4, 200, 2000) if smoke else (1000, 5000, 10000, 16, 2000, 100_000)
    )
    py = sys.executable

    def serve(port: int, upstream: str) -> list[str]:
        return [
            py,
            "-m",
            "gateway.cli",
            "serve",
            "--config",
            str(ROOT / "config.toml"),
            "--port",
            str(port),
            "--backend",
            f"speculative={upstream}",
            "--backend",
            f"baseline={upstream}",
        ]

    ports = [free_port() for _ in range(2)]
    upstream, gateway = (f"http://127.0.0.1:{p}" for p in ports)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    results: dict[str, object] = {"emulated_upstream": True, "smoke": smoke}
    with (
        process(emulate(ports[0], "0.000001"), cpu=0),
        process(serve(ports[1], upstream), cpu=1) as gw,
    ):
        for url in (upstream, gateway):
            await wait_healthy(url)
        await wait_for_profile(aiohttp.ClientSession, gateway, sys.stderr)
        await latencies(gateway, 50, 4)  # warm both paths
        await latencies(upstream, 50, 4)
        rows = []
        for conc, n in ((1, n1), (64, n64)):
            direct, _ = await latencies(upstream, n, conc)
            through, _ = await latencies(gateway, n, conc)
            added50 = (pct(through, 0.5) - pct(direct, 0.5)) * 1e3
            added99 = (pct(through, 0.99) - pct(direct, 0.99)) * 1e3
            rows.append(
                (conc, n, pct(direct, 0.5) * 1e3, pct(through, 0.5) * 1e3, added50, added99)
            )
        # Below saturation: requests arriving at a fixed rate (as in front of a
        # real engine, where each answer takes seconds and the gateway idles).
        for rate in (200, 800):
            direct = await paced(upstream, n64, rate)
            through = await paced(gateway, n64, rate)
            rows.append(
                (
                    f"{rate} req/s open",
                    n64,
                    pct(direct, 0.5) * 1e3,
                    pct(through, 0.5) * 1e3,
                    (pct(through, 0.5) - pct(direct, 0.5)) * 1e3,
                    (pct(through, 0.99) - pct(direct, 0.99)) * 1e3,
                )
            )
        _, direct_rps = await latencies(upstream, sat, 64)
        _, gw_rps = await latencies(gateway, sat, 64)
        direct_cps, direct_gap = await stream_rate(upstream, tokens, streams)
        gw_cps, gw_gap = await stream_rate(gateway, tokens, streams)
        rss_idle = rss_mb(gw.pid)
        await latencies(gateway, rss_n, 32)
        rss_after = rss_mb(gw.pid)
    print(
        "specroute proxy overhead (EMULATED upstream at ~zero model time; gateway on CPU 1, "
        "load generator + upstream on CPU 0)"
    )
    print(
        f"{'concurrency':>11} {'requests':>9} {'direct p50':>11} {'gateway p50':>12} "
        f"{'added p50':>10} {'added p99':>10}"
    )
    for conc, n, d50, g50, a50, a99 in rows:
        print(f"{conc!s:>17} {n:>9} {d50:>9.2f}ms {g50:>10.2f}ms {a50:>8.2f}ms {a99:>8.2f}ms")
    print(
        f"saturation (64 in flight, {sat} requests): direct {direct_rps:.0f} req/s, "
        f"gateway {gw_rps:.0f} req/s ({gw_rps / direct_rps:.2f}x)"
    )
    print(
        f"streaming ({streams} x {tokens}-token streams): direct {direct_cps:.0f} chunks/s, "
        f"gateway {gw_cps:.0f} chunks/s ({gw_cps / direct_cps:.2f}x); mean inter-chunk gap "
        f"{direct_gap * 1e3:.3f} ms direct, {gw_gap * 1e3:.3f} ms gateway "
        f"(+{(gw_gap - direct_gap) * 1e3:.3f} ms)"
    )
    decisions = decision_cost(200 if smoke else 2000)
    print("decision (features incl. tiktoken on a new prompt + profiled decide, with a draw):")
    for label, p50, p99 in decisions:
        print(f"  {label:>9} prompt: p50 {p50:7.1f} us, p99 {p99:7.1f} us")
    print(
        f"gateway RSS: {rss_idle:.1f} MB idle, {rss_after:.1f} MB after {rss_n} more requests "
        f"({rss_after - rss_idle:+.1f} MB)"
    )
    results.update(
        latency=rows,
        direct_rps=direct_rps,
        gateway_rps=gw_rps,
        chunks_per_s={"direct": direct_cps, "gateway": gw_cps},
        decision_us=decisions,
        rss_mb={"idle": rss_idle, "after": rss_after, "requests": rss_n},
    )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="small counts, for CI")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    figures = asyncio.run(main(args.smoke))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
