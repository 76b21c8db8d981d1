"""The profiled router on one measured GPU, in virtual time: docs/decision.md's scenarios.

    .venv/bin/python benchmarks/one_gpu_scenarios.py [REPO]

tooling/sim/shared_gpu.py runs the emulator's H200 step costs (1B draft, k=4), the
two servers time-sliced on one GPU or a GPU each, and the profile a profiler would
measure of them. Printed per scenario: the router's mean e2e over the per-request
oracle's or the better static route's, and its prediction error. REPO (default: this
checkout) is where `classifier` (the router) is imported from, say another commit's in
a git worktree, for the column beside; the simulator, the emulator's costs and the
gateway it imports stay this checkout's, so both columns meet the same truth (REPO's
classifier must offer what they import from it). EMULATED: the modelled timing of a
measured GPU, not a GPU run.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]


def main(argv: Sequence[str]) -> int:
    root = Path(argv[0]).resolve() if argv else HERE
    sys.path.insert(0, str(root))
    classifier = importlib.import_module("classifier")
    sys.path.remove(str(root))
    # The rest from this checkout; `classifier` stays REPO's (it is imported already).
    sys.path.insert(0, str(HERE))
    sim = importlib.import_module("tooling.sim.shared_gpu")
    names = importlib.import_module("tooling.workloads").MIXES["demo"]
    for module, home in ((classifier, root), (sim, HERE), (sys.modules["gateway"], HERE)):
        if not Path(str(module.__file__)).resolve().is_relative_to(home):
            raise SystemExit(f"{module.__name__} came from {module.__file__}, not {home}")
    print(f"EMULATED (measured H200, virtual time); the router of {root}")
    for name, value in scenarios(sim, classifier, names):
        print(f"{name:<52} {value}")
    return 0


def scenarios(sim: Any, classifier: Any, names: Sequence[str]) -> list[tuple[str, object]]:
    spec, base = classifier.Route.SPECULATIVE, classifier.Route.BASELINE
    static: Callable[[Any], Any] = classifier.StaticPolicy
    mean = sim.mean_latency
    requests = sim.jobs(100, seed=3)
    out: list[tuple[str, object]] = []
    alone = [sim.simulate(static(r), requests, 1) for r in (spec, base)]
    ours = sim.simulate(sim.profiled(), requests, 1)
    out.append(("c=1 / per-request oracle", round(mean(ours) / sim.oracle_latency(*alone), 3)))
    for gpus in (1, 2):
        for c in (8, 32):
            served = sim.simulate(sim.profiled(gpus=gpus), requests, c, gpus=gpus)
            best = min(mean(sim.simulate(static(r), requests, c, gpus=gpus)) for r in (spec, base))
            out.append(
                (f"fresh, {gpus} GPU(s), c={c} / better static", round(mean(served) / best, 3))
            )
            if gpus == 1:
                errors = (round(sim.mape(served, spec), 3), round(sim.mape(served, base), 3))
                out.append((f"fresh, 1 GPU, c={c}: MAPE speculative, baseline", errors))
    for c in (8, 32):
        ratios = []
        for seed in range(0, 3000, 1000):
            policy = sim.profiled()
            sim.simulate(policy, sim.jobs(34, seed=1 + seed), 1)
            sim.simulate(policy, sim.jobs(22, seed=108 + seed), c)
            measured = sim.jobs(22, seed=8 + seed)
            best = min(mean(sim.simulate(static(r), measured, c)) for r in (spec, base))
            ratios.append(round(mean(sim.simulate(policy, measured, c)) / best, 3))
        out.append((f"learned, 1 GPU, c={c} / better static (3 seeds)", ratios))
    for warm in (True, False):
        ratios = []
        for seed in (100, 300, 500):
            policy = sim.profiled()
            if warm:
                for burst in _bursts(sim, names, 12, seed):
                    sim.simulate(policy, burst, 2)
            ours_s = best_s = 0.0
            for burst in _bursts(sim, names, 6, seed + 100):
                ours_s += mean(sim.simulate(policy, burst, 2))
                # The pair's routes: PAIR since routes have names (an older REPO's
                # classifier iterates its Route enum instead).
                pair = getattr(classifier, "PAIR", None) or tuple(classifier.Route)
                best_s += min(mean(sim.simulate(static(r), burst, 2)) for r in pair)
            ratios.append(round(ours_s / best_s, 3))
        label = "warm" if warm else "cold"
        out.append((f"bursts of one kind, c=2, {label} / better static (3 seeds)", ratios))
    return out


def _bursts(sim: Any, names: Sequence[str], n: int, seed: int) -> list[Any]:
    return [sim.jobs(n, seed=seed + i, names=[name]) for i, name in enumerate(names)]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
