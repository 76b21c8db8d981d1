"""vLLM's defaults, where they matter: no per-request speculative metrics.

vLLM sends an answer's drafted and accepted tokens only with
--per-request-spec-decode-metrics, which is off unless asked for. Here the
speculative server runs without it: the twin of the pair's speculative server
that deploy/cpu/run_tier.sh starts beside it (up.sh --spec-off, exported as
SPECROUTE_VLLM_SPEC_OFF; with run_tier.sh --spec-metrics off, the pair's own
speculative server), with the pair's baseline. The default gateway must learn
acceptance from the server-wide /metrics counters by attributing each scrape
window to the requests decoding in it (gateway/backends/acceptance_sources.py). One
request at a time, every window holds one workload, so the attributed rate
must match the counters' own rate over the same requests.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from tests.support import wait_until
from tests.vllm.conftest import SPEC_OFF_ENV, Backends, Scrape, extra_server, parse_metrics
from tests.vllm.prompts import repeat_code

pytestmark = pytest.mark.vllm

MIN_REQUESTS = 24  # drafted 896 tokens (0.61 accepted) on one CPU: short of a 0.03 standard error
MAX_REQUESTS = 80  # 40 drafted ~1,340 there: enough on that CPU, not on every one
DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


@pytest.fixture(scope="module")
def backends(backends: Backends) -> Backends:
    """The pair as vLLM runs by default: the metrics-off speculative server, the
    pair's baseline (quiet_gateway and the tests below take this one)."""
    url = extra_server(SPEC_OFF_ENV, "spec-off", backends.model)
    return Backends(speculative=url, baseline=backends.baseline, model=backends.model)


async def test_the_speculative_server_runs_with_vllms_default(
    http: aiohttp.ClientSession, backends: Any
) -> None:
    body = repeat_code(0, backends.model)
    async with http.post(f"{backends.speculative}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        answer = await resp.json()
    assert not (answer.get("metrics") or {}).get("speculative_decoding"), answer.get("metrics")


# Up to 80 requests one at a time: 2 to 7 s each on two shared cores (the CPU decides).
@pytest.mark.timeout(900)
async def test_acceptance_is_attributed_from_the_counters(
    quiet_gateway: str,
    http: aiohttp.ClientSession,
    scrape: Callable[[str], Awaitable[Any]],
    backends: Any,
) -> None:
    before = await scrape(backends.speculative)
    seen: dict[str, object] = {}

    async def attributed() -> tuple[dict[str, Any], float] | None:
        async with http.get(f"{quiet_gateway}/ready") as resp:
            ready = await resp.json()
        async with http.get(f"{quiet_gateway}/metrics") as resp:
            ours = parse_metrics(await resp.text())
        rate = ours.get("specroute_attributed_acceptance_ratio", workload="code")
        seen["windows by outcome"] = window_outcomes(ours)
        seen["code's drafted tokens"] = ours.get(
            "specroute_attributed_draft_tokens", workload="code"
        )
        done = ready["acceptance_source"] == "counter_attribution" and math.isfinite(rate)
        return (ready, rate) if done else None

    # Every request to the speculative server (the override header; the decoding
    # is logged as for any request), whatever a policy would choose. How many drafted tokens
    # the rate needs depends on how bursty acceptance is (the fit's own residual),
    # so requests go on until the gateway says its rate is certain enough.
    for i in range(MAX_REQUESTS):  # one at a time: each scrape window holds code only
        async with http.post(
            f"{quiet_gateway}/v1/chat/completions",
            json=repeat_code(i, backends.model),
            headers={"x-specroute-route": "speculative"},
        ) as resp:
            assert resp.status == 200, await resp.text()
            await resp.read()
            assert resp.headers["x-specroute-route"] == "speculative"
        if i + 1 >= MIN_REQUESTS and await attributed():
            break

    # The last window lands with the next scrape (every 0.5 s).
    try:
        ready, rate = await wait_until(
            attributed, "counter attribution in use, with a rate for code", ignoring=(KeyError,)
        )
    except AssertionError as exc:  # why not: the windows' outcomes and the support
        raise AssertionError(f"{exc} after {i + 1} requests; {seen}") from exc
    assert ready["per_request_metrics"] is False, ready

    after = await scrape(backends.speculative)
    drafted = after.get(DRAFTED) - before.get(DRAFTED)
    truth = (after.get(ACCEPTED) - before.get(ACCEPTED)) / drafted
    assert drafted > 1000, drafted
    assert abs(rate - truth) < 0.05, (rate, truth, drafted)


def window_outcomes(ours: Scrape) -> dict[str, float]:
    """specroute_attribution_windows_total by outcome, from the gateway's /metrics."""
    outcomes: dict[str, float] = {}
    for (name, labels), value in ours.samples.items():
        if name == "specroute_attribution_windows_total":
            outcome = dict(labels)["outcome"]
            outcomes[outcome] = outcomes.get(outcome, 0.0) + value
    return outcomes
