"""Shadow copies on the real CPU vLLM pair: vLLM honours the copy's forced length,
and a copy made in idle time pairs with its user request, per-request metrics and all.

Needs SPECROUTE_VLLM_BACKENDS (deploy/cpu/run_tier.sh sets it) and the pair with
per-request metrics on (up.sh's default).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from classifier.tokens import load_tiktoken_counter
from gateway.app import create_app
from gateway.config import parse_config
from gateway.shadow.copy import shadow_body
from gateway.shadow.results import shadow_log_path
from tests.support import wait_until
from tests.vllm.conftest import parse_metrics
from tests.vllm.prompts import repeat_code
from tooling.local_stack import serve_app

pytestmark = pytest.mark.vllm

FORCED = 24  # longer than the natural answer below


@pytest.mark.parametrize("route", ["speculative", "baseline"])
@pytest.mark.parametrize("stream", [False, True])
async def test_vllm_gives_a_copy_exactly_the_forced_length(
    http: aiohttp.ClientSession, backends: Any, route: str, stream: bool
) -> None:
    body = {
        "model": backends.model,
        "messages": [{"role": "user", "content": "Answer with one word: yes or no?"}],
        "temperature": 0,
        "max_tokens": 200,
        "stop": ["."],
        "stream": stream,
    }
    natural = dict(body, stream=False)
    async with http.post(f"{backends.url(route)}/v1/chat/completions", json=natural) as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["usage"]["completion_tokens"] < FORCED

    copy = shadow_body(body, FORCED)
    async with http.post(
        f"{backends.url(route)}/v1/chat/completions",
        data=copy,
        headers={"Content-Type": "application/json"},
    ) as resp:
        assert resp.status == 200, await resp.text()
        raw = await resp.read()
    if stream:
        events = [json.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
        usage = next(e["usage"] for e in reversed(events) if e.get("usage"))
    else:
        usage = json.loads(raw)["usage"]
    assert usage["completion_tokens"] == FORCED


@pytest.fixture
async def shadowing_gateway(backends: Any, tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """The rules policy (code at temperature 0 -> speculative, above 1.0 -> baseline) with
    every successful request copied, and an outcome log (the shadows' lines go beside)."""
    log = tmp_path / "outcomes.jsonl"
    config = parse_config(
        {
            "backends": {
                "speculative": {"urls": [backends.speculative], "num_speculative_tokens": 4},
                "baseline": {"urls": [backends.baseline]},
            },
            "routing": {"policy": "rules"},
            "upstream": {"scrape_interval_s": 0.5},
            "outcome_log": {"path": str(log)},
            "shadow": {"share": 1.0},
        }
    )
    runner, url = await serve_app(create_app(config, tokens=load_tiktoken_counter()))
    try:
        yield url, log
    finally:
        await runner.cleanup()


async def test_a_copy_in_idle_time_pairs_with_its_request_on_the_real_pair(
    shadowing_gateway: tuple[str, Path], http: aiohttp.ClientSession, backends: Any
) -> None:
    url, log = shadowing_gateway
    shadows = shadow_log_path(log)
    sent = []
    # Code at temperature 0 goes speculative (its copy to the baseline); above 1.0
    # the rules send it to the baseline, and its copy repeats the function on the
    # speculative server, where n-grams draft (a poem may draft nothing, and then
    # vLLM reports no per-request figures). A seed and a fixed length keep it so.
    hot = dict(repeat_code(1, backends.model), temperature=1.1, seed=1234, ignore_eos=True)
    for body in (repeat_code(0, backends.model), hot):
        async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            answer = await resp.json()
            sent.append((resp.headers["x-specroute-route"], answer["usage"]["completion_tokens"]))

        def lines(n: int = len(sent)) -> list[dict[str, Any]] | None:
            if not shadows.exists():
                return None
            got = [json.loads(line) for line in shadows.read_text().splitlines()]
            return got if len(got) >= n else None

        # One at a time: the next user request would cancel this copy.
        await wait_until(lines, "the copy to end", timeout_s=60, interval_s=0.2)

    got = lines()
    assert got is not None
    assert [s for s, _ in sent] == ["speculative", "baseline"]
    for (route, tokens), line in zip(sent, got, strict=True):
        assert line["outcome"] == "completed", line
        assert line["primary_route"] == route and line["shadow_route"] != route, line
        assert line["comparable"] is True, line
        assert line["shadow_completion_tokens"] == tokens == line["primary_completion_tokens"]
        assert "messages" not in json.dumps(line)  # figures only, never text
    # The second copy ran on the speculative server, which reports its acceptance
    # per request; the first ran on the baseline.
    assert got[0]["acceptance"] is None
    assert got[1]["acceptance_source"] == "per_request_metrics"
    assert 0.0 <= got[1]["acceptance"] <= 1.0

    async with http.get(f"{url}/metrics") as resp:
        ours = parse_metrics(await resp.text())
    assert ours.get("specroute_shadow_requests_total", outcome="completed") == 2
    assert ours.get("specroute_requests_total") == 2  # users only
    assert ours.get("specroute_shadow_speedup", workload="code") > 0
