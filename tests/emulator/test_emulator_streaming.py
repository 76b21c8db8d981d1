"""Streaming: one chunk per engine step, usage chunks, per-request spec-decode metrics."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from tooling.emulator import ACCEPTANCE_HEADER

if TYPE_CHECKING:
    from conftest import ReadSse, StartEmulator

STREAM_USAGE = {"include_usage": True, "continuous_usage_stats": True}


def _content_chunks(events: list[Any]) -> list[dict[str, Any]]:
    """Chunks that carry generated text (not the role chunk, not the usage chunk)."""
    return [
        e
        for e in events
        if isinstance(e, dict) and e["choices"] and "role" not in e["choices"][0]["delta"]
    ]


def _tokens_per_chunk(events: list[Any]) -> list[int]:
    counts = [e["usage"]["completion_tokens"] for e in _content_chunks(events)]
    return [b - a for a, b in zip([0, *counts], counts, strict=False)]


async def test_chat_stream_shape(
    emulator: StartEmulator, read_sse: ReadSse, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("baseline")
    body = chat_body("hi", max_tokens=9, stream=True, stream_options=STREAM_USAGE)
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = await read_sse(resp)
    assert events[-1] == "[DONE]"
    role, *content, final_usage, _ = events
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role["usage"]["completion_tokens"] == 0
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    assert len({e["id"] for e in events[:-1]}) == 1
    assert [e["choices"][0]["finish_reason"] for e in content] == [None] * 8 + ["length"]
    assert (
        "stop_reason" in content[-1]["choices"][0] and "stop_reason" not in content[0]["choices"][0]
    )
    assert final_usage["choices"] == [] and final_usage["usage"]["completion_tokens"] == 9
    assert "metrics" not in final_usage  # per-request spec metrics are off by default, as in vLLM


async def test_baseline_streams_one_token_per_chunk(
    emulator: StartEmulator, read_sse: ReadSse, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("baseline")
    body = chat_body("hi", max_tokens=40, ignore_eos=True, stream=True, stream_options=STREAM_USAGE)
    events = await read_sse(await client.post("/v1/chat/completions", json=body))
    assert _tokens_per_chunk(events) == [1] * 40


async def test_speculative_chunk_per_step_matches_spec_metrics(
    emulator: StartEmulator, read_sse: ReadSse, chat_body: Callable[..., dict[str, Any]]
) -> None:
    """A speculative step sends one chunk with 1 + accepted tokens; steps = chunks - 1."""
    client = await emulator("speculative", per_request_spec_decode_metrics="detailed")
    body = chat_body("hi", max_tokens=60, ignore_eos=True, stream=True, stream_options=STREAM_USAGE)
    resp = await client.post("/v1/chat/completions", json=body, headers={ACCEPTANCE_HEADER: "0.8"})
    events = await read_sse(resp)
    per_chunk = _tokens_per_chunk(events)
    assert sum(per_chunk) == 60 and max(per_chunk) > 1 and max(per_chunk) <= 5
    assert per_chunk[0] == 1  # the prefill step samples exactly one token
    spec = events[-2]["metrics"]["speculative_decoding"]
    assert spec["num_spec_steps"] == len(per_chunk) - 1
    # Every step but the last gives 1 + accepted tokens; the last may be cut by max_tokens.
    assert per_chunk[1:-1] == [1 + a for a in spec["per_step_accepted"][:-1]]
    assert per_chunk[-1] <= 1 + spec["per_step_accepted"][-1]


def _validate_detailed(metrics: dict[str, Any]) -> None:
    """The invariants vLLM's own test asserts (tests/.../test_per_request_spec_decode_metrics)."""
    histogram = metrics["acceptance_histogram"]
    assert metrics["num_spec_steps"] == sum(histogram) > 0
    assert metrics["num_accepted_draft_tokens"] == sum(j * n for j, n in enumerate(histogram))
    assert metrics["num_accepted_draft_tokens"] == sum(metrics["per_step_accepted"])
    assert metrics["num_draft_tokens"] == sum(metrics["per_step_drafted"])
    assert len(metrics["per_step_accepted"]) == metrics["num_spec_steps"]
    assert math.isclose(
        metrics["mean_acceptance_length"],
        1 + metrics["num_accepted_draft_tokens"] / metrics["num_spec_steps"],
    )
    assert math.isclose(
        metrics["draft_acceptance_rate"],
        metrics["num_accepted_draft_tokens"] / metrics["num_draft_tokens"],
    )
    assert metrics["num_spec_tokens"] == 4 and len(histogram) == 5


async def test_per_request_spec_metrics_detailed(
    emulator: StartEmulator, read_sse: ReadSse
) -> None:
    client = await emulator("speculative", per_request_spec_decode_metrics="detailed")
    payload = {"prompt": "alpha beta gamma", "temperature": 0, "max_tokens": 24}
    body = await (await client.post("/v1/completions", json=payload)).json()
    _validate_detailed(body["metrics"]["speculative_decoding"])
    assert body["metrics"]["time_to_first_token_ms"] is None  # full model_dump: nulls present
    stream = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    events = await read_sse(await client.post("/v1/completions", json=stream))
    with_metrics = [e for e in events if isinstance(e, dict) and e.get("metrics") is not None]
    assert len(with_metrics) == 1 and with_metrics[0] is events[-2]
    assert with_metrics[0]["usage"] is not None
    _validate_detailed(with_metrics[0]["metrics"]["speculative_decoding"])


async def test_per_request_spec_metrics_summary(emulator: StartEmulator, read_sse: ReadSse) -> None:
    client = await emulator("speculative", per_request_spec_decode_metrics="summary")
    payload = {"prompt": "alpha", "temperature": 0, "max_tokens": 24}
    spec = (await (await client.post("/v1/completions", json=payload)).json())["metrics"][
        "speculative_decoding"
    ]
    assert spec["per_step_accepted"] is None and spec["num_spec_steps"] > 0
    stream = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    events = await read_sse(await client.post("/v1/completions", json=stream))
    assert "per_step_accepted" not in events[-2]["metrics"]["speculative_decoding"]


async def test_spec_metrics_need_speculative_mode(emulator: StartEmulator) -> None:
    with pytest.raises(ValueError, match="requires mode=speculative"):
        await emulator("baseline", per_request_spec_decode_metrics="detailed")


async def test_completion_stream_without_usage(emulator: StartEmulator, read_sse: ReadSse) -> None:
    client = await emulator("speculative")
    events = await read_sse(
        await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 5, "stream": True})
    )
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all("usage" not in e for e in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert set(chunks[0]["choices"][0]) == {
        "index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids",
    }  # fmt: skip


async def test_natural_stop_sends_eos_chunk(
    emulator: StartEmulator, read_sse: ReadSse, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("baseline", text_min_tokens=5, text_max_tokens=5)
    body = chat_body("hi", stream=True, stream_options=STREAM_USAGE)
    events = await read_sse(await client.post("/v1/chat/completions", json=body))
    last = _content_chunks(events)[-1]
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["choices"][0]["delta"] == {"content": ""}
    assert last["usage"]["completion_tokens"] == 6  # 5 words + EOS
