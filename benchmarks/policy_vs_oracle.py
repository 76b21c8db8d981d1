"""Does routing by predicted latency pay? The profiled policy vs static routes vs the oracle.

    .venv/bin/python benchmarks/policy_vs_oracle.py            # ~15 minutes on 2 cores
    .venv/bin/python benchmarks/policy_vs_oracle.py --gpus 2   # a GPU per server
    .venv/bin/python benchmarks/policy_vs_oracle.py --smoke    # small counts (CI)

On EMULATED backends (GPU-shaped timing, see tooling/emulator/CALIBRATION.md),
for each concurrency: the same mixed request set (structured, SQL, code,
creative, RAG, chat) is sent through gateways running the profiled policy (the
default), the rules, and each static route; each request's better time of the
two static routes is the oracle. By default the two emulated servers share one
emulated GPU, as deployed, so at concurrency > 1 the oracle is a reference,
not a bound: it times each request with the whole GPU given to one route, and
any routing that keeps both servers busy pays two weight reads per round
instead of one (under load the profiled policy keeps a busy shared GPU's batch
on one server, "consolidate", and can only track the better static route,
hence the last column). With --gpus 2 each server has its own GPU and
per-request routing is what pays. Printed: mean e2e of each as a ratio to the
oracle, from one run. The profiled gateway measures its engine profile at
start (nothing is timed before it is in, so no probe overlaps a timed
request), then starts from a state deliberately far from the truth for code:
as if earlier answers had measured its acceptance at rate 0.05 (believed
a ~0.40; the emulator's truth, and the profile's code probe, 0.75), so code is
first routed to the baseline and only exploration can find out; its
acceptance estimates are printed against the emulator's truth. Its latency
predictions are compared with what was measured (MAPE per route,
ProfiledPolicy.error_totals()): as sent (the x-specroute-predicted figure) and
given the answer's true length and acceptance, which the request does not
state (the emulator draws plain-text lengths uniformly from 48-320 tokens,
capped by max_tokens), i.e. the profile's own error.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from classifier.features import Workload  # noqa: E402
from classifier.persistence import STATE_FORMAT  # noqa: E402
from classifier.router import PredictionErrors, ProfiledPolicy  # noqa: E402
from classifier.tokens import load_tiktoken_counter  # noqa: E402
from classifier.types import Route  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.state import RUNTIME  # noqa: E402
from gateway.telemetry import configure_logging  # noqa: E402
from tooling.bench.targets import wait_for_profile  # noqa: E402
from tooling.loadgen import Result, run_closed_loop  # noqa: E402
from tooling.local_stack import MODEL, gateway_config, local_stack, serve_app  # noqa: E402
from tooling.workloads import Request, build  # noqa: E402

POLICIES = ("profiled", "rules", "static-speculative", "static-baseline")
# The emulator's per-position acceptance for these requests (CALIBRATION.md):
# structured 0.80, code and SQL 0.75, chat 0.50 pulled toward 0.25 by T^2
# (T = 0.7 -> 0.3775), creative at T >= 1 -> 0.25, RAG (chat kind, T = 0) 0.50.
TRUTH = {"structured": 0.80, "code": 0.75, "chat": 0.3775, "creative": 0.25, "long_context": 0.50}
# The start far from the truth: code's acceptance as if 8 earlier answers (full
# weight) had measured accepted/drafted 0.05; the probe's prior is added on top.
WRONG_CODE_RATE, WRONG_CODE_ANSWERS = 0.05, 8.0


def wrong_code_state(k: int) -> dict[str, Any]:
    """A router state (ProfiledPolicy.load_state) with code's belief far below the truth."""
    n, rate = WRONG_CODE_ANSWERS, WRONG_CODE_RATE
    belief = [0.5, 1.0, 0.2, n, n * rate, n * rate * rate]  # the prior is reset by the profile
    return {
        "format": STATE_FORMAT,
        "routes": {Route.SPECULATIVE.value: k, Route.BASELINE.value: 0},
        "acceptance": {f"{Route.SPECULATIVE.value}/{Workload.CODE.value}/-1": belief},
        "outputs": {},
        "failures": {},
    }


async def closed_loop(url: str, requests: list[Request], concurrency: int) -> list[Result]:
    """All of `requests` through `url` with `concurrency` in flight; every one must succeed."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        results = await run_closed_loop(session, url, requests, concurrency)
    failed = [r for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} requests to {url} failed, first: {failed[0]}")
    return results


async def main(smoke: bool, only: tuple[int, ...] = (), gpus: int = 1) -> int:
    per_workload = 3 if smoke else 16
    warmup_per_workload = 4 if smoke else 40
    levels = only or ((1, 8) if smoke else (1, 8, 32))
    names = ["structured", "sql", "code", "creative", "rag", "chat"]
    tokens = load_tiktoken_counter()
    print(
        "policy vs oracle on EMULATED backends (modelled GPU timing), "
        + ("both servers on ONE GPU" if gpus == 1 else "a GPU per server")
        + "; mean e2e / oracle's, one run\n"
    )
    rows: dict[int, dict[str, float]] = {}
    tallies: dict[int, Counter[str]] = {}
    errors: dict[int, dict[Route, PredictionErrors]] = {}
    # The stack's own gateway is not measured: a static one, so that it never profiles.
    async with local_stack(
        time_scale=0.05 if smoke else 0.25,
        tokens=tokens,
        gpus=gpus,
        routing={"policy": "static-baseline"},
    ) as stack:
        gateways: dict[str, str] = {}
        runners = []
        for policy in POLICIES:
            config = gateway_config(
                stack.speculative, stack.baseline, stack.emulator, routing={"policy": policy}
            )
            runner, url = await serve_app(create_app(config, tokens=tokens))
            runners.append(runner)
            gateways[policy] = url
        profiled = runners[0].app[RUNTIME].current.policy
        assert isinstance(profiled, ProfiledPolicy)
        try:
            # Its start-up profile first: no probe may overlap a timed request.
            await wait_for_profile(aiohttp.ClientSession, gateways["profiled"], sys.stdout)
            profiled.load_state(wrong_code_state(stack.emulator.num_speculative_tokens))
            start = profiled.estimated_acceptance()[Route.SPECULATIVE][Workload.CODE]
            print(
                f"profiled gateway starts with code's acceptance a at {start:.3f} "
                f"(truth {TRUTH['code']:.2f})\n"
            )
            print(
                f"{'concurrency':>11} {'requests':>9} {'oracle s':>9} "
                + "".join(f"{p:>19}" for p in POLICIES)
                + f"{'prof/best static':>17}"
            )
            for level in levels:
                requests = build(names, per_workload * max(1, level // 4), model=MODEL, seed=level)
                # The profiled policy learns all the time; give it this level's load first.
                warmup = build(names, warmup_per_workload, model=MODEL, seed=100 + level)
                await closed_loop(gateways["profiled"], warmup, level)
                base = await closed_loop(stack.baseline, requests, level)
                spec = await closed_loop(stack.speculative, requests, level)
                oracle = statistics.fmean(
                    min(b.e2e_s, s.e2e_s) for b, s in zip(base, spec, strict=True)
                )
                row = {}
                for policy in POLICIES:
                    before = profiled.error_totals()
                    sent = await closed_loop(gateways[policy], requests, level)
                    row[policy] = statistics.fmean(s.e2e_s for s in sent) / oracle
                    if policy == "profiled":
                        tallies[level] = Counter(f"{s.route}/{s.reason}" for s in sent)
                        after = profiled.error_totals()
                        windows = {r: e.since(before.get(r)) for r, e in after.items()}
                        errors[level] = {r: w for r, w in windows.items() if w.count}
                rows[level] = row
                print(
                    f"{level:>11} {len(requests):>9} {oracle:>9.3f} "
                    + "".join(f"{row[p]:>19.3f}" for p in POLICIES)
                    + f"{row['profiled'] / min(row[p] for p in POLICIES[2:]):>17.3f}",
                    flush=True,
                )
            estimates = profiled.estimated_acceptance()[Route.SPECULATIVE]
        finally:
            for runner in runners:
                await runner.cleanup()
    print("\nprofiled policy's routes/reasons in the measured window:")
    for level, tally in tallies.items():
        print(f"  {level:>3}: " + ", ".join(f"{k} {n}" for k, n in tally.most_common()))
    print(
        "\nprofiled policy's latency predictions vs measured in the window, MAPE per route: "
        "as sent (x-specroute-predicted) | given the answer's true length (the profile alone)"
    )
    for level, per_route in errors.items():
        print(
            f"  {level:>3}: "
            + "; ".join(
                f"{route.value} {e.mape()[0]:.1%} | {e.mape()[1]:.1%} (n={e.count})"
                for route, e in per_route.items()
            )
        )
    explored = sum(t["speculative/explore"] + t["baseline/explore"] for t in tallies.values())
    measured = sum(t.total() for t in tallies.values())
    print(
        f"\nacceptance a per workload: estimate vs the emulator's truth "
        f"(code's started at {start:.3f}; {explored} of {measured} measured decisions explored)"
    )
    worst = 0.0
    for workload, truth in TRUTH.items():
        estimate = estimates[next(w for w in estimates if w.value == workload)]
        worst = max(worst, abs(estimate - truth))
        print(f"  {workload:<13} {estimate:.3f} vs {truth:.3f}  ({estimate - truth:+.3f})")
    beats = all(
        r["profiled"] < min(r["static-speculative"], r["static-baseline"]) for r in rows.values()
    )
    within = all(r["profiled"] <= 1.10 for r in rows.values())
    print(
        f"\nprofiled policy beats both static routes at every level: {beats}; "
        f"within 10% of the oracle at every level: {within}; worst acceptance error {worst:.3f}"
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--levels", default="", help="concurrencies to run, e.g. 1,8")
    parser.add_argument(
        "--gpus", type=int, choices=(1, 2), default=1, help="1: one shared GPU (deployed); 2"
    )
    args = parser.parse_args()
    configure_logging("error")
    only = tuple(int(x) for x in args.levels.split(",") if x)
    sys.exit(asyncio.run(main(args.smoke, only, args.gpus)))
