"""Several speculation configurations chosen per request (issue 42), EMULATED in virtual time.

    .venv/bin/python benchmarks/n_routes.py                       # 3 seeds, 600 requests each
    .venv/bin/python benchmarks/n_routes.py --seeds 3,4,5,6 --per-workload 100 --prior-sd 0.1

tooling/sim/shared_gpu.py runs the emulator's step costs of the measured H200
(tooling/emulator/gpu/h200-llama3.1-8b.json: the Llama-3.1-8B target, the EAGLE-3-like head,
n-gram lookup) for four routes, none, eagle3 k=3, eagle3 k=7 and ngram k=8 (FOUR_ROUTES),
each request's true acceptance per drafter (tooling/emulator/acceptance.py
DRAFTER_ACCEPTANCE, one jitter per request), and the profile a profiler would measure of
every route (its probes at its own k and drafter). On the same requests and seeds it
prints:

- c=1, mixed traffic (tooling/workloads.py's six built-in workloads): every static route;
  the per-request oracle over all four and over each pair with "none"; the router over
  all four routes and restricted to each pair with "none" (the two-route gateway), fresh
  (learning from the profile's probes: the main case) and learned (after as many requests
  again); which route each workload went to, what the routes' true costs were, the
  router's prediction error per route and its beliefs against the truth;
- one GPU shared by the four servers (time-sliced), c=8 and c=32: every static route and
  the routers, fresh, over the best static route;
- a GPU each (four GPUs), c=8 and c=32: the four-route gateway, fresh, over the best
  static route (which uses one of them): no goal, how far spreading the load goes.

Goals (issue 42), ratios within one run: c=1, the four-route gateway within 1.03x the
four-route oracle and capturing >= 80% of what that oracle gains over the best two-route
oracle; one GPU at c=8 and c=32, no slower than the best static route. EMULATED: the
modelled timing of a measured GPU, not a GPU run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from classifier import FinishedRequest, Route, StaticPolicy  # noqa: E402
from classifier.router import RouterConfig  # noqa: E402
from tooling.emulator.costs import describe_gpu  # noqa: E402
from tooling.sim import shared_gpu as sim  # noqa: E402
from tooling.workloads import MIXES  # noqa: E402

ROUTES = sim.FOUR_ROUTES
NONE = ROUTES[0]
PAIRS = tuple((NONE, r) for r in ROUTES if r.speculative)
LOADED = (8, 32)
ORACLE_GOAL, CAPTURE_GOAL, STATIC_GOAL = 1.03, 0.80, 1.00


@dataclass
class Seed:
    """One seed's figures: mean e2e (s) per configuration, and what the router did."""

    seed: int
    c1: dict[str, float] = field(default_factory=dict)
    loaded: dict[int, dict[str, float]] = field(default_factory=dict)
    # (workload, route) -> requests, for the four-route router fresh and for the oracle.
    routed: Counter[tuple[str, str]] = field(default_factory=Counter)
    oracle_routed: Counter[tuple[str, str]] = field(default_factory=Counter)
    loaded_routed: dict[int, Counter[str]] = field(default_factory=dict)
    # A GPU each: the four-route gateway's mean e2e (s) and its routes, per concurrency.
    each: dict[int, float] = field(default_factory=dict)
    each_routed: dict[int, Counter[str]] = field(default_factory=dict)
    # (workload, route) -> mean e2e (s) of that static route at c=1.
    truth: dict[tuple[str, str], float] = field(default_factory=dict)
    mape: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    reasons: Counter[str] = field(default_factory=Counter)
    # route -> router workload -> (believed a, true a) after the fresh run.
    beliefs: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    # route -> router workload -> the measured rates of its static run's answers.
    rates: dict[str, dict[str, list[float]]] = field(default_factory=dict)


class Recording(StaticPolicy):
    """A static route that keeps each answer's measured acceptance rate (accepted drafts
    per step / k, as the router learns it), per router workload."""

    def __init__(self, route: Route) -> None:
        super().__init__(route)
        self.rates: defaultdict[str, list[float]] = defaultdict(list)

    def learn(self, outcome: FinishedRequest) -> None:
        if outcome.acceptance is not None:
            self.rates[outcome.features.workload.value].append(outcome.acceptance)


def measure(seed: int, per_workload: int, prior_sd: float | None, mix: str) -> Seed:
    config = RouterConfig() if prior_sd is None else RouterConfig(prior_sd=prior_sd)
    out = Seed(seed)
    names = MIXES[mix]
    requests = sim.jobs(per_workload, seed=seed, names=names)
    warmup = sim.jobs(per_workload, seed=seed + 1000, names=names)

    def static(route: Route, c: int) -> list[sim.Served]:
        return sim.simulate(StaticPolicy(route), requests, c, routes=ROUTES)

    def gateway(table: Sequence[sim.SimRoute], c: int, *, learned: bool = False) -> float:
        policy = sim.profiled(routes=table, config=config)
        if learned:
            sim.simulate(policy, warmup, c, routes=table, seed=seed + 1000)
        return sim.mean_latency(sim.simulate(policy, requests, c, routes=table, seed=seed))

    recorders = {r.name: Recording(r.name) for r in ROUTES}
    runs = {r.name: sim.simulate(recorders[r.name], requests, 1, routes=ROUTES) for r in ROUTES}
    out.rates = {r.value: dict(recorder.rates) for r, recorder in recorders.items()}
    for r in ROUTES:
        out.c1[f"static {r.name}"] = sim.mean_latency(runs[r.name])
        for workload in names:
            times = [s.duration_s for s in runs[r.name] if s.job.workload == workload]
            out.truth[(workload, r.name)] = statistics.fmean(times)
    for _, r in PAIRS:
        out.c1[f"oracle none+{r.name}"] = sim.oracle_latency(runs[NONE.name], runs[r.name])
    out.c1["oracle, all four"] = sim.oracle_latency(*runs.values())
    # Each workload to its cheapest route, known in advance: what a router can reach that
    # knows every workload's truth but not each request's luck.
    cheapest = {w: min(ROUTES, key=lambda r: out.truth[(w, r.name)]).name for w in names}
    out.c1["each workload's cheapest route, known"] = statistics.fmean(
        runs[cheapest[job.workload]][i].duration_s for i, job in enumerate(requests)
    )
    for job, route in zip(requests, sim.oracle_routes(runs), strict=True):
        out.oracle_routed[(job.workload, route.value)] += 1
    for pair in PAIRS:
        out.c1[f"gateway none+{pair[1].name}"] = gateway(pair, 1)
        out.c1[f"gateway none+{pair[1].name}, learned"] = gateway(pair, 1, learned=True)
    policy = sim.profiled(routes=ROUTES, config=config)
    served = sim.simulate(policy, requests, 1, routes=ROUTES, seed=seed)
    out.c1["gateway, all four"] = sim.mean_latency(served)
    out.c1["gateway, all four, learned"] = gateway(ROUTES, 1, learned=True)
    out.routed = Counter((s.job.workload, s.route.value) for s in served)
    out.reasons = Counter(s.reason for s in served)
    fit = policy.error_totals()
    for r in ROUTES:
        errors = fit.get(r.name)
        given = errors.mape()[1] if errors is not None else float("nan")
        count = sum(s.route == r.name for s in served)
        out.mape[r.name] = (sim.mape(served, r.name), given, count)
    believed = policy.estimated_acceptance()
    for r in ROUTES:
        if not r.speculative:
            continue
        truth: defaultdict[str, list[float]] = defaultdict(list)
        for job in requests:
            truth[job.features.workload.value].append(job.acceptance_on(r))
        out.beliefs[r.name] = {
            w.value: (a, statistics.fmean(truth[w.value]))
            for w, a in believed.get(r.name, {}).items()
            if w.value in truth
        }
    for c in LOADED:
        figures = {f"static {r.name}": sim.mean_latency(static(r.name, c)) for r in ROUTES}
        for pair in PAIRS:
            figures[f"gateway none+{pair[1].name}"] = gateway(pair, c)
        fresh = sim.profiled(routes=ROUTES, config=config)
        loaded = sim.simulate(fresh, requests, c, routes=ROUTES)
        figures["gateway, all four"] = sim.mean_latency(loaded)
        out.loaded[c] = figures
        out.loaded_routed[c] = Counter(s.route.value for s in loaded)
        # A GPU each (a static route's run is the same: one server busy either way).
        gpus = len(ROUTES)
        alone = sim.profiled(routes=ROUTES, config=config, gpus=gpus)
        spread = sim.simulate(alone, requests, c, routes=ROUTES, gpus=gpus)
        out.each[c] = sim.mean_latency(spread)
        out.each_routed[c] = Counter(s.route.value for s in spread)
    return out


def capture(c1: dict[str, float]) -> tuple[float, float]:
    """The four-route gateway over the four-route oracle, and the share it captures of what
    that oracle gains over the best two-route oracle."""
    oracle = c1["oracle, all four"]
    two = min(v for k, v in c1.items() if k.startswith("oracle none+"))
    ours = c1["gateway, all four"]
    return ours / oracle, (two - ours) / (two - oracle)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="3,4,5", help="comma-separated (default 3,4,5)")
    parser.add_argument("--per-workload", type=int, default=100, help="requests per workload")
    parser.add_argument(
        "--prior-sd", type=float, default=None, help="RouterConfig.prior_sd (a what-if)"
    )
    parser.add_argument(
        "--mix",
        choices=("mixed", "held_out"),
        default="mixed",
        help="the built-in workloads, or with text-to-SQL its markers call chat (held_out)",
    )
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    with ProcessPoolExecutor() as pool:
        results = list(
            pool.map(
                measure,
                seeds,
                [args.per_workload] * len(seeds),
                [args.prior_sd] * len(seeds),
                [args.mix] * len(seeds),
            )
        )
    report(results, args)
    return 0


def _row(name: str, values: Sequence[float], fmt: str = "{:8.3f}") -> str:
    mean = statistics.fmean(values)
    return f"{name:<48}" + "".join(fmt.format(v) for v in values) + "  |" + fmt.format(mean)


def report(results: Sequence[Seed], args: argparse.Namespace) -> None:
    seeds = [r.seed for r in results]
    names = MIXES[args.mix]
    requests = args.per_workload * len(names)
    print(f"EMULATED (virtual time) on {describe_gpu(ROUTES[1].emulator).split(', drafter')[0]}")
    print("routes: " + ", ".join(f"{r.name} ({r.label})" for r in ROUTES))
    prior = "default" if args.prior_sd is None else f"{args.prior_sd} (what-if)"
    print(f"{requests} requests a seed ({', '.join(names)}), seeds {seeds}; prior_sd {prior}")
    heading = f"{'':<48}" + "".join(f"{'seed ' + str(s):>8}" for s in seeds) + "  |    mean"

    print("\n## c=1: mean e2e (ms)")
    print(heading)
    for name in results[0].c1:
        print(_row(name, [r.c1[name] * 1000 for r in results], "{:8.1f}"))
    print("\n## c=1: the goals")
    print(heading)
    ratios = [capture(r.c1) for r in results]
    print(_row(f"four-route gateway / its oracle (<= {ORACLE_GOAL})", [x[0] for x in ratios]))
    print(_row(f"share of the oracle's gain captured (>= {CAPTURE_GOAL})", [x[1] for x in ratios]))
    for kind in ("", ", learned"):
        two_route = [min(r.c1[f"gateway none+{p[1].name}{kind}"] for p in PAIRS) for r in results]
        ours = [r.c1["gateway, all four" + kind] for r in results]
        ratio = [a / b for a, b in zip(ours, two_route, strict=True)]
        print(_row(f"four-route / best two-route gateway{kind}", ratio))
    learned = [r.c1["gateway, all four, learned"] for r in results]
    two = [min(v for k, v in r.c1.items() if k.startswith("oracle none+")) for r in results]
    oracle = [r.c1["oracle, all four"] for r in results]
    print(
        _row(
            "captured, learned (>= 0.80)",
            [(t - g) / (t - o) for t, g, o in zip(two, learned, oracle, strict=True)],
        )
    )

    print("\n## c=1: each workload's true cost per static route (ms, all seeds; * lowest)")
    print(f"{'workload':<12}" + "".join(f"{r.name:>12}" for r in ROUTES))
    for workload in names:
        means = {
            r.name: statistics.fmean(x.truth[(workload, r.name)] for x in results) * 1000
            for r in ROUTES
        }
        cheapest = min(means, key=means.__getitem__)
        cells = "".join(
            f"{means[r.name]:>11.1f}{'*' if r.name == cheapest else ' '}" for r in ROUTES
        )
        print(f"{workload:<12}{cells}")

    print("\n## c=1: where each workload went (share of its requests, all seeds): gateway | oracle")
    print(f"{'workload':<12}" + "".join(f"{r.name:>16}" for r in ROUTES))
    for workload in names:
        cells = ""
        for r in ROUTES:
            sent = sum(x.routed[(workload, r.name)] for x in results)
            chosen = sum(x.oracle_routed[(workload, r.name)] for x in results)
            total = args.per_workload * len(results)
            cells += f"{sent / total:>9.0%} |{chosen / total:>4.0%}"
        print(f"{workload:<12}{cells}")
    reasons = sum((x.reasons for x in results), Counter())
    print("reasons: " + ", ".join(f"{k} {v}" for k, v in reasons.most_common()))

    print("\n## c=1, fresh: prediction error per route, MAPE as sent / given the true length")
    for r in ROUTES:
        cells = "  ".join(
            f"{x.mape[r.name][0]:.3f} / {x.mape[r.name][1]:.3f} ({x.mape[r.name][2]})"
            for x in results
        )
        print(f"{r.name:<12} {cells}")
    print(f"\n## c=1, fresh: believed a / true a per route and workload (seed {seeds[0]})")
    for name, beliefs in results[0].beliefs.items():
        cells = ", ".join(f"{w} {b:.2f}/{t:.2f}" for w, (b, t) in beliefs.items())
        print(f"{name:<12} {cells}")

    sd = RouterConfig().prior_sd if args.prior_sd is None else args.prior_sd
    print(f"\n## c=1: between-request sd of the measured rate, static runs (the prior's: {sd})")
    for r in ROUTES:
        if not r.speculative:
            continue
        spreads = {
            w: statistics.stdev([v for x in results for v in x.rates[r.name].get(w, [])])
            for w in results[0].rates[r.name]
        }
        print(f"{r.name:<12} " + ", ".join(f"{w} {v:.3f}" for w, v in spreads.items()))

    for c in LOADED:
        print(f"\n## one GPU, c={c}, fresh: mean e2e / the best static route")
        print(heading)
        static = [min(v for k, v in x.loaded[c].items() if k.startswith("static")) for x in results]
        for name in results[0].loaded[c]:
            print(_row(name, [x.loaded[c][name] / b for x, b in zip(results, static, strict=True)]))
        routed = sum((x.loaded_routed[c] for x in results), Counter())
        print(
            "four-route gateway's routes: " + ", ".join(f"{k} {v}" for k, v in routed.most_common())
        )

    print("\n## a GPU each (four GPUs, a static route uses one), fresh: / the best static route")
    print(heading)
    for c in LOADED:
        static = [min(v for k, v in x.loaded[c].items() if k.startswith("static")) for x in results]
        spread = [x.each[c] / b for x, b in zip(results, static, strict=True)]
        print(_row(f"c={c}: gateway, all four", spread))
        routed = sum((x.each_routed[c] for x in results), Counter())
        print("  its routes: " + ", ".join(f"{k} {v}" for k, v in routed.most_common()))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
