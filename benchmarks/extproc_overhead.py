"""Added latency and throughput: direct, `specroute serve` (2, 4, 50 routes; tracing on),
Envoy alone and Envoy + `specroute ext-proc`, over one EMULATED upstream (negligible time
scale), in one run.

    flock /tmp/specroute-cpu.lock .venv/bin/python benchmarks/extproc_overhead.py
    .venv/bin/python benchmarks/extproc_overhead.py --routes 2 --no-envoy --no-tracing

CPU 0: the emulated upstream, this load generator and the OTLP sink; CPU 1: the gateway
under test (serve; or Envoy, and the picker with it). Non-streamed chat, max_tokens 1.
Every route points at the same upstream, so the decision is made but costs no model time:
what is measured is the gateway. "cpu ms/req" is the gateway's own CPU (user + system)
over the c=32 run, per request (Envoy + picker: both processes). Printed figures,
nothing asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.overhead import emulate, free_port, latencies, pct, process  # noqa: E402
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

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_s(pids: Sequence[int]) -> float:
    """User + system CPU seconds of these processes so far (Linux /proc)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / _TICKS


async def measure(url: str, n1: int, nsat: int, pids: Sequence[int] = ()) -> dict[str, float]:
    await latencies(url, 200, 4)  # warm
    one, _ = await latencies(url, n1, 1)
    before = cpu_s(pids)
    _, rps = await latencies(url, nsat, 32)
    out = {"p50_ms": pct(one, 0.50) * 1e3, "p99_ms": pct(one, 0.99) * 1e3, "rps_c32": rps}
    if pids:
        out["cpu_ms_per_req"] = (cpu_s(pids) - before) / nsat * 1e3
    return out


def routes_config(n: int, upstream: str, out: Path) -> Path:
    """A gateway config with `n` routes, all on `upstream`: one without speculation, the
    others n-gram at k 1..8 in turn (each a different speculation, as a real pool's)."""
    lines = ["[routes.r00]", f'urls = ["{upstream}"]', 'method = "none"']
    for i in range(1, n):
        lines += [f"[routes.r{i:02d}]", f'urls = ["{upstream}"]', 'method = "ngram"',
                  f"num_speculative_tokens = {1 + (i - 1) % 8}"]  # fmt: skip
    out.write_text("\n".join(lines) + "\n")
    return out


@asynccontextmanager
async def otlp_sink() -> AsyncIterator[str]:
    """An OTLP/HTTP receiver that accepts and drops every batch: tracing on, healthy."""

    async def accept(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", accept)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextmanager
def environ(**values: str) -> Iterator[None]:
    """These environment variables set while a process is started (it inherits them)."""
    os.environ.update(values)
    try:
        yield
    finally:
        for name in values:
            del os.environ[name]


async def serve_case(name: str, argv: list[str], port: int, n1: int, nsat: int) -> dict[str, float]:
    with process(argv, cpu=1) as proc:
        gateway = f"http://127.0.0.1:{port}"
        await wait_healthy(gateway, timeout_s=120)
        await wait_for_profile(aiohttp.ClientSession, gateway, sys.stderr, timeout_s=600)
        print(f"measuring {name}", file=sys.stderr, flush=True)
        return await measure(gateway, n1, nsat, [proc.pid])


def envoy_alone(config: Path) -> Path:
    """The same bootstrap without the ext_proc filter: Envoy's own cost."""
    doc = json.loads(config.read_text())
    manager = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    filters = manager["typed_config"]["http_filters"]
    manager["typed_config"]["http_filters"] = [f for f in filters if "ext_proc" not in f["name"]]
    out = config.with_name("envoy-alone.json")
    out.write_text(json.dumps(doc))
    return out


async def main(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    py, n1, nsat = sys.executable, args.n1, args.nsat
    up_port, gw_port, grpc_port, metrics_port, envoy_port = (free_port() for _ in range(5))
    upstream = f"http://127.0.0.1:{up_port}"
    backends = ["--backend", f"speculative={upstream}", "--backend", f"baseline={upstream}"]
    serve = [py, "-m", "gateway.cli", "serve", "--port", str(gw_port)]
    picker = [py, "-m", "gateway.cli", "ext-proc", "--port", str(grpc_port),
              "--metrics-port", str(metrics_port), *backends]  # fmt: skip
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, process(emulate(up_port), cpu=0):
        await wait_healthy(upstream)
        out["direct"] = await measure(upstream, n1, nsat)
        for n in args.routes:
            config = routes_config(n, upstream, Path(tmp) / f"r{n}.toml")
            argv = [*serve, *backends] if n == 2 else [*serve, "--config", str(config)]
            out[f"serve {n} routes"] = await serve_case(f"serve {n}", argv, gw_port, n1, nsat)
        if args.tracing:
            async with otlp_sink() as sink:
                with environ(OTEL_EXPORTER_OTLP_ENDPOINT=sink):
                    case = serve_case("tracing", [*serve, *backends], gw_port, n1, nsat)
                    out["serve 2 routes, tracing"] = await case
        if not args.envoy:
            return out
        ports = {SPECULATIVE: up_port, BASELINE: up_port, PICKER: grpc_port,
                 LISTENER: envoy_port, ADMIN: free_port()}  # fmt: skip
        config = render(POOL_BOOTSTRAP, ports, Path(tmp) / "envoy.json")
        envoy = [envoy_binary(), "--disable-hot-restart", "--concurrency", "1", "-c"]
        front = f"http://127.0.0.1:{envoy_port}"
        with process([*envoy, str(envoy_alone(config))], cpu=1) as alone:
            await wait_healthy(front)
            out["envoy alone"] = await measure(front, n1, nsat, [alone.pid])
        with process(picker, cpu=1) as pick, process([*envoy, str(config)], cpu=1) as proxy:
            metrics = f"http://127.0.0.1:{metrics_port}"
            await wait_healthy(metrics)
            await wait_for_profile(aiohttp.ClientSession, metrics, sys.stderr)
            await wait_healthy(front)
            out["envoy+ext-proc"] = await measure(front, n1, nsat, [pick.pid, proxy.pid])
    return out


def table(result: dict[str, dict[str, float]]) -> list[str]:
    direct = result["direct"]
    rows = ["| path | p50 c=1 (ms) | added p50 (ms) | p99 c=1 (ms) | req/s c=32 | x direct "
            "| cpu ms/req |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in result.items():
        added = r["p50_ms"] - direct["p50_ms"]
        cpu = f"{r['cpu_ms_per_req']:.2f}" if "cpu_ms_per_req" in r else ""
        ratio = r["rps_c32"] / direct["rps_c32"]
        rows.append(f"| {name} | {r['p50_ms']:.2f} | {added:+.2f} | {r['p99_ms']:.2f} "
                    f"| {r['rps_c32']:.0f} | {ratio:.2f} | {cpu} |")  # fmt: skip
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n1", type=int, default=300, help="requests timed at c=1")
    parser.add_argument("--nsat", type=int, default=2000, help="requests timed at c=32")
    parser.add_argument("--routes", default="2,4,50",
                        help="serve with these route counts (default 2,4,50)")  # fmt: skip
    parser.add_argument("--no-tracing", dest="tracing", action="store_false",
                        help="skip serve with tracing on (OTLP to a local sink)")  # fmt: skip
    parser.add_argument("--no-envoy", dest="envoy", action="store_false",
                        help="skip Envoy alone and Envoy + ext-proc")  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    args.routes = [int(n) for n in args.routes.split(",") if n]
    result = asyncio.run(main(args))
    print("\n".join(table(result)))
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
