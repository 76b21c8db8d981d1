"""Added latency and throughput: direct, `specroute serve`, and Envoy + `specroute ext-proc`,
over one EMULATED upstream (negligible time scale), in one run.

    flock /tmp/specroute-cpu.lock .venv/bin/python benchmarks/extproc_overhead.py

CPU 0: the emulated upstream and this load generator; CPU 1: the gateway under
test (serve; or Envoy and the picker together). Non-streamed chat, max_tokens 1.
Both routes point at the same upstream, so the decision is made but costs no
model time. Printed figures, nothing asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.overhead import free_port, latencies, pct, process  # noqa: E402
from tooling.bench.targets import wait_for_profile  # noqa: E402
from tooling.envoy import (  # noqa: E402
    ADMIN,
    BASELINE,
    LISTENER,
    PICKER,
    POOL_BOOTSTRAP,
    SPECULATIVE,
    envoy_binary,
    render,
)  # fmt: skip
from tooling.local_stack import wait_healthy  # noqa: E402


async def measure(url: str, n1: int, nsat: int) -> dict[str, float]:
    await latencies(url, 50, 4)  # warm
    one, _ = await latencies(url, n1, 1)
    _, rps = await latencies(url, nsat, 32)
    return {"p50_ms": pct(one, 0.50) * 1e3, "p99_ms": pct(one, 0.99) * 1e3, "rps_c32": rps}


async def main(n1: int, nsat: int) -> dict[str, dict[str, float]]:
    py = sys.executable
    up_port, gw_port, grpc_port, metrics_port, envoy_port = (free_port() for _ in range(5))
    upstream = f"http://127.0.0.1:{up_port}"
    backends = ["--backend", f"speculative={upstream}", "--backend", f"baseline={upstream}"]
    emulate = [
        py,
        "-m",
        "gateway.cli",
        "emulate",
        "--mode",
        "baseline",
        "--port",
        str(up_port),
        "--time-scale",
        "0.000001",
        "--max-num-seqs",
        "512",
        "--model",
        "emulated-model",
    ]
    serve = [py, "-m", "gateway.cli", "serve", "--port", str(gw_port), *backends]
    picker = [py, "-m", "gateway.cli", "ext-proc", "--port", str(grpc_port),
              "--metrics-port", str(metrics_port), *backends]  # fmt: skip
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, process(emulate, cpu=0):
        await wait_healthy(upstream)
        out["direct"] = await measure(upstream, n1, nsat)
        with process(serve, cpu=1):
            gateway = f"http://127.0.0.1:{gw_port}"
            await wait_healthy(gateway)
            await wait_for_profile(aiohttp.ClientSession, gateway, sys.stderr)
            out["serve"] = await measure(gateway, n1, nsat)
        ports = {SPECULATIVE: up_port, BASELINE: up_port, PICKER: grpc_port,
                 LISTENER: envoy_port, ADMIN: free_port()}  # fmt: skip
        config = render(POOL_BOOTSTRAP, ports, Path(tmp) / "envoy.json")
        envoy = [envoy_binary(), "-c", str(config), "--disable-hot-restart", "--concurrency", "1"]
        with process(picker, cpu=1), process(envoy, cpu=1):
            metrics = f"http://127.0.0.1:{metrics_port}"
            await wait_healthy(metrics)
            await wait_for_profile(aiohttp.ClientSession, metrics, sys.stderr)
            front = f"http://127.0.0.1:{envoy_port}"
            await wait_healthy(front)
            out["envoy+ext-proc"] = await measure(front, n1, nsat)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n1", type=int, default=300)
    parser.add_argument("--nsat", type=int, default=2000)
    args = parser.parse_args()
    result = asyncio.run(main(args.n1, args.nsat))
    direct = result["direct"]
    print("| path | p50 c=1 (ms) | added p50 (ms) | p99 c=1 (ms) | req/s c=32 |")
    print("|---|---|---|---|---|")
    for name, r in result.items():
        added = r["p50_ms"] - direct["p50_ms"]
        print(
            f"| {name} | {r['p50_ms']:.2f} | {added:.2f} | {r['p99_ms']:.2f} | {r['rps_c32']:.0f} |"
        )
    print(json.dumps(result))
