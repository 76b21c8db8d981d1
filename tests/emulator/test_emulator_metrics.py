"""/metrics exposes vLLM's names and types, and the numbers agree with the responses."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.support import wait_until
from tooling.emulator import EMULATOR

if TYPE_CHECKING:
    from conftest import StartEmulator

LABELS = {"model_name": "smollm2-135m", "engine": "0"}
# Family name -> type, as vLLM 0.32 exports them (the parser strips counters' _total).
COMMON = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:iteration_tokens_total": "histogram",
    "vllm:request_params_max_tokens": "histogram",
    "vllm:request_params_n": "histogram",
    "vllm:request_max_num_generation_tokens": "histogram",
}
SPEC = {
    "vllm:spec_decode_num_drafts": "counter",
    "vllm:spec_decode_num_draft_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "counter",
}


async def scrape(
    client: TestClient[Any, Any],
) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> {sorted labels: value}, exactly as exposed (with _total etc.)."""
    text = await (await client.get("/metrics")).text()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    return float(samples[name][tuple(sorted({**LABELS, **labels}.items()))])


async def test_metric_names_types_and_labels(emulator: StartEmulator) -> None:
    for mode, expected in (("baseline", COMMON), ("speculative", COMMON | SPEC)):
        client = await emulator(mode)
        text = await (await client.get("/metrics")).text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        # The text format carries prometheus_client's `_created` samples (vLLM's do too)
        # as gauges of their own; they are not part of the contract.
        families = {n: f for n, f in families.items() if not n.endswith("_created")}
        assert {n: f.type for n, f in families.items()} == expected
        for family in families.values():
            for sample in family.samples:
                assert (
                    sample.labels["model_name"] == "smollm2-135m" and sample.labels["engine"] == "0"
                )
        reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
        assert reasons == {"stop", "length", "abort", "error", "repetition"}
        # The exposed sample names, which dashboards and the gateway's scraper use.
        assert "vllm:request_success_total" in text and "vllm:prompt_tokens_total" in text
        if mode == "speculative":
            per_pos = families["vllm:spec_decode_num_accepted_tokens_per_pos"]
            positions = {s.labels["position"] for s in per_pos.samples if s.name.endswith("_total")}
            assert positions == {"0", "1", "2", "3"}
            assert "vllm:spec_decode_num_draft_tokens_total" in text


async def test_counters_agree_with_responses(
    emulator: StartEmulator, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("speculative", per_request_spec_decode_metrics="summary")
    prompt = completion = drafts = draft_tokens = accepted = 0
    for i, max_tokens in enumerate((5, 30, 64)):
        resp = await client.post(
            "/v1/chat/completions", json=chat_body(f"q{i}", max_tokens=max_tokens, temperature=0)
        )
        body = await resp.json()
        prompt += body["usage"]["prompt_tokens"]
        completion += body["usage"]["completion_tokens"]
        spec = body["metrics"]["speculative_decoding"]
        drafts += spec["num_spec_steps"]
        draft_tokens += spec["num_draft_tokens"]
        accepted += spec["num_accepted_draft_tokens"]
    m = await scrape(client)
    assert value(m, "vllm:prompt_tokens_total") == prompt
    assert value(m, "vllm:generation_tokens_total") == completion
    assert value(m, "vllm:spec_decode_num_drafts_total") == drafts
    assert value(m, "vllm:spec_decode_num_draft_tokens_total") == draft_tokens == 4 * drafts
    assert value(m, "vllm:spec_decode_num_accepted_tokens_total") == accepted
    per_pos = [
        value(m, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(p))
        for p in range(4)
    ]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)
    finished = sum(
        value(m, "vllm:request_success_total", finished_reason=r) for r in ("stop", "length")
    )
    assert finished == 3 and value(m, "vllm:e2e_request_latency_seconds_count") == 3
    assert value(m, "vllm:time_to_first_token_seconds_count") == 3
    assert value(m, "vllm:num_requests_running") == 0


async def test_baseline_has_no_spec_counters(
    emulator: StartEmulator, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("baseline")
    await client.post("/v1/chat/completions", json=chat_body("x", max_tokens=20, ignore_eos=True))
    m = await scrape(client)
    assert not any(name.startswith("vllm:spec_decode") for name in m)
    # Baseline: one ITL observation per token after the first.
    assert value(m, "vllm:inter_token_latency_seconds_count") == 19


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_waiting_running_and_kv_usage_under_load(
    emulator: StartEmulator, chat_body: Callable[..., dict[str, Any]]
) -> None:
    """max_num_seqs queues requests; the gauges say so mid-run."""
    client = await emulator("baseline", max_num_seqs=2, time_scale=0.5)
    body = chat_body("x", max_tokens=4000, ignore_eos=True)  # long enough to watch
    tasks = [asyncio.create_task(client.post("/v1/chat/completions", json=body)) for _ in range(5)]
    engine = client.app[EMULATOR].engine  # type: ignore[index]
    try:
        await wait_until(
            lambda: engine.num_running == 2 and engine.num_waiting == 3, "2 running, 3 waiting"
        )

        async def published() -> dict[str, Any] | None:  # by the engine's next step
            m = await scrape(client)
            running = value(m, "vllm:num_requests_running")
            waiting = value(m, "vllm:num_requests_waiting")
            return m if (running, waiting) == (2, 3) else None

        m = await wait_until(published, "the gauges to show 2 running, 3 waiting")
        assert 0 < value(m, "vllm:kv_cache_usage_perc") < 0.05
    finally:
        await _cancel(tasks)
    await wait_until(lambda: engine.num_running == engine.num_waiting == 0, "all 5 aborted")
    assert engine.counts.client_aborts == 5


async def test_kv_budget_limits_admission(
    emulator: StartEmulator, chat_body: Callable[..., dict[str, Any]]
) -> None:
    """A request waits while the KV cache cannot hold its whole footprint."""
    client = await emulator("baseline", kv_cache_tokens=1200, max_model_len=1000, time_scale=0.5)
    body = chat_body("x", max_tokens=500, ignore_eos=True)  # ~510 tokens of KV each
    tasks = [asyncio.create_task(client.post("/v1/chat/completions", json=body)) for _ in range(3)]
    engine = client.app[EMULATOR].engine  # type: ignore[index]
    try:
        await wait_until(
            lambda: engine.num_running == 2 and engine.num_waiting == 1, "2 running, 1 waiting"
        )
        await wait_until(lambda: engine.kv_usage() > 0.5, "the KV cache over half full")
        assert engine.kv_usage() <= 1
    finally:
        await _cancel(tasks)
