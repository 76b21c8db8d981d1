"""The profiled router on open-loop mixed traffic, one measured GPU, in virtual time.

    .venv/bin/python benchmarks/open_loop.py [REPO] [--requests N] [--seeds K]

Production traffic arrives open-loop, kinds interleaved: Poisson arrivals of a held-out
mix (40% JSON-schema extraction, 15% SQL and code at T=0, 30% chat and creative writing,
15% long documents with short answers) at light, moderate and heavy load, and a tidal day
(the rate rising eight-fold twice over and back), on the measured H200's step costs
(tooling/sim/shared_gpu.py: both servers time-sliced on one GPU, each request's
acceptance the emulator's truth), with both measured drafters. Every target runs the
same requests at the same arrival times:

- static: every request on one route; "better" is the faster of the two in that cell;
- oracle: each request's faster time of the two static runs, a bound no router on one
  GPU meets (those runs each had the GPU to themselves);
- oracle's routes: the oracle's choice per request, run on the one GPU (time-sliced);
- the router: a fresh gateway's ProfiledPolicy, learning as it goes.

Printed per cell: mean in flight (the better static run's), the router over the better
static route and over the oracle (ratio of mean e2e, 95% bootstrap interval paired by
request), its p50 and p90 over the better static route's, the oracle's routes run for
real, the share sent to the speculative server, and the router's prediction error (MAPE)
per route. REPO (default: this checkout) is where `classifier` is imported from, as in
benchmarks/one_gpu_scenarios.py, for the old router beside the new on the same requests.
EMULATED: the modelled timing of a measured GPU in virtual time, not a GPU run; vLLM's
dynamic speculation is not modelled here (`specroute bench --emulate --with-dynamic`).
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
# The held-out mix, in fortieths: structured 40%, sql and code 15%, chat and creative
# 30%, long documents 15% (issue 51's mix).
SHARES = {"structured": 16, "sql": 3, "code": 3, "chat": 6, "creative": 6, "rag": 6}
# Requests per second: about 0.6, 5 and 35 in flight on the better static route.
LOADS = {"light": (1.0,), "moderate": (8.0,), "heavy": (32.0,)}
# A tidal day in eight phases of equal request counts: ~0.6 to ~35 in flight and back.
TIDE = (1.0, 4.0, 16.0, 32.0, 32.0, 16.0, 4.0, 1.0)
DRAFTERS = {"draft-1b": 4, "eagle3": 3}


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", nargs="?", default=str(HERE))
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args(argv)
    root = Path(args.repo).resolve()
    sys.path.insert(0, str(root))
    classifier = importlib.import_module("classifier")
    sys.path.remove(str(root))
    sys.path.insert(0, str(HERE))
    sim = importlib.import_module("tooling.sim.shared_gpu")
    intervals = importlib.import_module("tooling.bench.intervals")
    if not Path(str(classifier.__file__)).resolve().is_relative_to(root):
        raise SystemExit(f"classifier came from {classifier.__file__}, not {root}")
    print(f"EMULATED (measured H200, virtual time, open loop); the router of {root}")
    print(
        "cell                     seed in-flight  router/better [95%]      router/oracle"
        "  p50   p90   oracle's routes  to spec  MAPE spec base"
    )
    for drafter, k in DRAFTERS.items():
        emulator = replace(sim.MEASURED_SPEC, drafter=drafter, num_speculative_tokens=k)
        cells = {**LOADS, "tidal day": TIDE}
        for name, rates in cells.items():
            for seed in range(1, args.seeds + 1):
                line = cell(sim, classifier, intervals, emulator, rates, args.requests, seed)
                print(f"{drafter:<9}{name:<16}{seed:>4} {line}")
    return 0


def cell(
    sim: Any,
    classifier: Any,
    intervals: Any,
    emulator: Any,
    rates: Sequence[float],
    count: int,
    seed: int,
) -> str:
    spec, base = classifier.Route.SPECULATIVE, classifier.Route.BASELINE
    requests = mix(sim, emulator, count, seed)
    arrivals = tide(sim, rates, count, seed)

    def run(policy: Any) -> list[Any]:
        served: list[Any] = sim.simulate(policy, requests, 0, arrivals=arrivals, emulator=emulator)
        return served

    statics = {r: run(classifier.StaticPolicy(r)) for r in (spec, base)}
    better = min(statics.values(), key=sim.mean_latency)
    oracle = [min(a.duration_s, b.duration_s) for a, b in zip(*statics.values(), strict=True)]
    real_oracle = run(Replay(classifier, sim.oracle_routes(statics)))
    ours = run(sim.profiled(emulator))
    mine = [s.duration_s for s in ours]
    best = [s.duration_s for s in better]
    ci = intervals.ratio_of_sums(mine, best, digits=3)
    ratio = sum(mine) / sum(best)
    p50, p90 = (quantile(mine, q) / quantile(best, q) for q in (0.5, 0.9))
    to_spec = sum(s.route == spec for s in ours) / len(ours)
    errors = (sim.mape(ours, spec), sim.mape(ours, base))
    return (
        f"{in_flight(better, arrivals):>8.1f}  {ratio:.3f} [{ci.lo:.3f}-{ci.hi:.3f}]"
        f"  {sum(mine) / sum(oracle):>12.3f}  {p50:.3f} {p90:.3f}"
        f"  {sim.mean_latency(real_oracle) / sim.mean_latency(better):>15.3f}"
        f"  {to_spec:>6.0%}  {errors[0]:>9.3f} {errors[1]:.3f}"
    )


class Replay:
    """The oracle's route for each request in turn (sent in order, as the sim sends)."""

    def __init__(self, classifier: Any, routes: Sequence[Any]) -> None:
        self._decision, self._routes, self._next = classifier.Decision, list(routes), 0

    def decide(self, features: Any, state: Any, pair: int = 0, rng: Any = None) -> Any:
        route = self._routes[self._next]
        self._next += 1
        return self._decision(route, "oracle")

    def learn(self, outcome: Any) -> None:
        return None


def mix(sim: Any, emulator: Any, count: int, seed: int) -> list[Any]:
    """`count` requests of SHARES's kinds, interleaved at random."""
    out: list[Any] = []
    for name, share in SHARES.items():
        n = max(1, round(count * share / 40))
        out += sim.jobs(n, seed=seed, names=[name], emulator=emulator)
    random.Random(seed).shuffle(out)
    return out[:count]


def tide(sim: Any, rates: Sequence[float], count: int, seed: int) -> list[float]:
    """Poisson arrivals, the rate stepping through `rates` in phases of equal counts."""
    out: list[float] = []
    phase = -(-count // len(rates))
    for i, rate in enumerate(rates):
        start = out[-1] if out else 0.0
        n = min(phase, count - len(out))
        out += [start + t for t in sim.poisson_arrivals(n, rate, seed * 100 + i)]
    return out


def in_flight(served: Sequence[Any], arrivals: Sequence[float]) -> float:
    """Requests in the system on average: total time in it over the span (Little)."""
    end = max(a + s.duration_s for a, s in zip(arrivals, served, strict=True))
    return sum(s.duration_s for s in served) / end


def quantile(values: Sequence[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[round(q * 100) - 1]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
