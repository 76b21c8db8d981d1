"""Four routes on two GPUs: the router told each route's device, or not (EMULATED).

    .venv/bin/python benchmarks/devices.py                        # seeds 3,4,5, 600 requests each
    .venv/bin/python benchmarks/devices.py --seeds 3 --per-workload 50

tooling/sim/shared_gpu.py runs the measured H200's step costs (tooling/emulator/gpu/
h200-llama3.1-8b.json) in virtual time for the four routes of benchmarks/n_routes.py
(FOUR_ROUTES: none, eagle3 k=3, eagle3 k=7, ngram k=8), placed on two GPUs round-robin
as deploy/gpu/routes.py places them (its `place`; the gateway config it writes names
device "gpuN"): each GPU time-sliced among its own busy servers only. Mixed traffic (the
six built-in workloads), closed loop at c=1, 8 and 32, on the same requests and seeds:

- every static route (one GPU busy, the other idle);
- the router told the devices ([routes.NAME] device; its profile: each route's device,
  beside 2 with a neighbour on its GPU), fresh (the profile's probes only);
- the router not told (what the gateway measures and assumes without `device`: one
  device for all, beside 2 for every route), fresh, on the same two GPUs;
- the per-request oracle over the static runs (each request's best static time).

It prints mean e2e per configuration and seed, told / not told and told / the best static
route (mean and spread over seeds), and where each router sent its requests and why. No
goals: the figures as they come. EMULATED: the modelled timing of a measured GPU, not a
GPU run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import random  # noqa: E402

from classifier import Decision, LiveState, RequestFeatures, Route, StaticPolicy  # noqa: E402
from classifier.router import ProfiledPolicy, RouterConfig  # noqa: E402
from deploy.gpu import routes as deploy_routes  # noqa: E402
from tooling.emulator.costs import describe_gpu  # noqa: E402
from tooling.sim import shared_gpu as sim  # noqa: E402

ROUTES = sim.FOUR_ROUTES
GPUS = ("0", "1")
LEVELS = (1, 8, 32)
TOLD, NOT_TOLD, ORACLE = "router, told the devices", "router, not told", "oracle (static runs)"


def placement(gpus: Sequence[str] = GPUS) -> dict[Route, str]:
    """Each route's device as deploy/gpu/routes.py places it and names it in the toml."""
    specs = [deploy_routes.RouteSpec(r.name.value, r.spec().method, r.k) for r in ROUTES]
    placed, _ = deploy_routes.place(
        specs,
        target_gib=0.0,
        gpu_gib=None,
        ports=range(8100, 8100 + len(specs)),
        gpus=gpus,
        utils=[0.4] * len(specs),
    )
    return {Route(p.route.name): f"gpu{p.gpu}" for p in placed}


DEVICES = placement()


@dataclass
class Seed:
    """One seed's figures per concurrency: mean e2e (s) per configuration, and per router
    its requests per route and per decision reason."""

    seed: int
    means: dict[int, dict[str, float]] = field(default_factory=dict)
    routed: dict[int, dict[str, Counter[str]]] = field(default_factory=dict)
    reasons: dict[int, dict[str, Counter[str]]] = field(default_factory=dict)
    # Per router: the share of its decisions that found both GPUs with requests in flight.
    both_busy: dict[int, dict[str, float]] = field(default_factory=dict)


class Watched(ProfiledPolicy):
    """The profiled policy, counting the decisions that found every GPU busy."""

    decisions = both = 0

    def decide(
        self, features: RequestFeatures, state: LiveState, rng: random.Random | None = None
    ) -> Decision:
        busy = {DEVICES[r] for r, b in state.servers.items() if b.inflight > 0}
        self.decisions += 1
        self.both += len(busy) == len(GPUS)
        return super().decide(features, state, rng)


def watched(devices: dict[Route, str] | None) -> Watched:
    """sim.profiled's policy over ROUTES, watched."""
    profile = sim.engine_profile(routes=ROUTES, devices=devices)
    return Watched(RouterConfig(), routes=[r.spec() for r in ROUTES], profile=profile)


def static_name(route: Route) -> str:
    return f"static {route.value} ({DEVICES[route]})"


def measure(seed: int, per_workload: int) -> Seed:
    out = Seed(seed)
    requests = sim.jobs(per_workload, seed=seed)
    for c in LEVELS:
        runs = {
            r.name: sim.simulate(StaticPolicy(r.name), requests, c, routes=ROUTES, devices=DEVICES)
            for r in ROUTES
        }
        means = {static_name(r): sim.mean_latency(s) for r, s in runs.items()}
        routers = {TOLD: watched(DEVICES), NOT_TOLD: watched(None)}
        out.routed[c], out.reasons[c], out.both_busy[c] = {}, {}, {}
        for name, policy in routers.items():
            served = sim.simulate(policy, requests, c, routes=ROUTES, devices=DEVICES, seed=seed)
            means[name] = sim.mean_latency(served)
            out.routed[c][name] = Counter(s.route.value for s in served)
            out.reasons[c][name] = Counter(s.reason for s in served)
            out.both_busy[c][name] = policy.both / policy.decisions
        means[ORACLE] = sim.oracle_latency(*runs.values())
        out.means[c] = means
    return out


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="3,4,5", help="comma-separated (default 3,4,5)")
    parser.add_argument("--per-workload", type=int, default=100, help="requests per workload")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    with ProcessPoolExecutor() as pool:
        results = list(pool.map(measure, seeds, [args.per_workload] * len(seeds)))
    report(results, args.per_workload)
    return 0


def _cells(values: Sequence[float], fmt: str) -> str:
    return " | ".join(fmt.format(v) for v in values) + " | " + fmt.format(statistics.fmean(values))


def report(results: Sequence[Seed], per_workload: int) -> None:
    seeds = [r.seed for r in results]
    print(f"EMULATED (virtual time) on {describe_gpu(ROUTES[1].emulator).split(', drafter')[0]}")
    print("two GPUs; routes (deploy/gpu/routes.py's round-robin placement):")
    print("  " + ", ".join(f"{r.name.value} ({r.label}) -> {DEVICES[r.name]}" for r in ROUTES))
    requests = per_workload * len(sim.MIXED)
    print(f"{requests} requests a seed ({', '.join(sim.MIXED)}), seeds {seeds}")
    head = "| " + " | ".join(f"seed {s}" for s in seeds) + " | mean |"
    rule = "|---" * (len(seeds) + 2) + "|"
    for c in LEVELS:
        print(f"\n### c={c}: mean e2e (ms)\n\n| configuration {head}\n{rule}")
        for name in results[0].means[c]:
            print(
                f"| {name} | " + _cells([r.means[c][name] * 1000 for r in results], "{:.1f}") + " |"
            )
        best = [min(v for k, v in r.means[c].items() if k.startswith("static")) for r in results]
        ratios = {
            "told / not told": [r.means[c][TOLD] / r.means[c][NOT_TOLD] for r in results],
            "told / best static": [
                r.means[c][TOLD] / b for r, b in zip(results, best, strict=True)
            ],
            "not told / best static": [
                r.means[c][NOT_TOLD] / b for r, b in zip(results, best, strict=True)
            ],
            "told / oracle": [r.means[c][TOLD] / r.means[c][ORACLE] for r in results],
        }
        print(f"\n| ratio {head} spread |\n{rule}---|")
        for name, values in ratios.items():
            spread = f"{min(values):.3f}-{max(values):.3f}"
            print(f"| {name} | " + _cells(values, "{:.3f}") + f" | {spread} |")
        print()
        for router in (TOLD, NOT_TOLD):
            sent = sum((r.routed[c][router] for r in results), Counter())
            why = sum((r.reasons[c][router] for r in results), Counter())
            total = sum(sent.values())
            shares = ", ".join(
                f"{r.name.value} ({DEVICES[r.name]}) {sent[r.name.value] / total:.0%}"
                for r in ROUTES
            )
            on = Counter({d: 0 for d in sorted(set(DEVICES.values()))})
            for r in ROUTES:
                on[DEVICES[r.name]] += sent[r.name.value]
            devices = ", ".join(f"{d} {n / total:.0%}" for d, n in on.items())
            reasons = ", ".join(f"{k} {v}" for k, v in why.most_common())
            both = statistics.fmean(r.both_busy[c][router] for r in results)
            print(
                f"- {router}: {shares}; per GPU {devices}; decisions finding both GPUs busy"
                f" {both:.0%}; reasons: {reasons}"
            )
        faster = sum(r.means[c][TOLD] < r.means[c][NOT_TOLD] for r in results)
        print(f"- told faster than not told in {faster} of {len(results)} seeds")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
