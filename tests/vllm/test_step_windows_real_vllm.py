"""The gateway reads each real vLLM server's decode step from its /metrics.

vLLM records one inter-token latency per decoding request per engine step, and
one iteration_tokens observation per step (vllm/v1/metrics/stats.py); the
gateway's scraper turns their deltas into a step time and a batch per window and
fits them into that route's latency model (gateway/backends.py, learning.py).
Here requests go straight to the baseline server, not through the gateway, as
another client's would: the gateway must still measure that server's step, and
what it exports must be vLLM's own figure over the same requests.

Needs SPECROUTE_VLLM_BACKENDS (deploy/cpu/run_tier.sh sets it).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from gateway.scraper import Scrape, parse_metrics
from tests.gateway.test_observability import samples
from tests.support import wait_until
from tests.vllm.test_costmodel_real_vllm import repeat_code

pytestmark = pytest.mark.vllm


async def vllm_scrape(http: aiohttp.ClientSession, url: str) -> Scrape:
    async with http.get(f"{url}/metrics") as resp:
        assert resp.status == 200
        return parse_metrics(await resp.text(), 0.0)


async def gateway_metric(http: aiohttp.ClientSession, gateway: str, key: Any) -> float | None:
    async with http.get(f"{gateway}/metrics") as resp:
        return samples(await resp.text()).get(key)


FITTED = ("specroute_step_windows_total", (("backend", "baseline"), ("outcome", "fitted")))
STEP = ("specroute_backend_step_seconds", (("backend", "baseline"),))


@pytest.mark.timeout(300)
async def test_the_gateway_measures_a_servers_step_from_traffic_it_did_not_send(
    cost_model_gateway: str, http: aiohttp.ClientSession, backends: Any
) -> None:
    before = await vllm_scrape(http, backends.baseline)
    assert before.gaps is not None and before.steps is not None  # vLLM exports them
    for i in range(3):
        body = repeat_code(i, backends.model)
        async with http.post(f"{backends.baseline}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()
    await wait_until(
        lambda: gateway_metric(http, cost_model_gateway, FITTED),
        "a baseline step window fitted by the gateway",
        timeout_s=30.0,
        interval_s=0.2,
    )
    after = await vllm_scrape(http, backends.baseline)
    assert after.gaps is not None and after.gap_seconds is not None and after.steps is not None
    assert before.gap_seconds is not None
    gaps = after.gaps - before.gaps
    assert gaps >= 3 * 30  # three answers of up to 64 tokens, one gap per token after the first
    vllm_step = (after.gap_seconds - before.gap_seconds) / gaps
    seen = await gateway_metric(http, cost_model_gateway, STEP)
    assert seen is not None
    # The gateway's last window holds part of the same steps (one request at a time).
    assert 0.5 * vllm_step <= seen <= 2.0 * vllm_step, (seen, vllm_step)
