"""Record real requests through the gateway, redacted, then replay them with their timing.

The recording must keep what routing depends on (token counts, structure,
sampling) and nothing of what was said.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from classifier.features import Endpoint, extract_features
from classifier.tokens import TokenCounter
from gateway.config import ConfigError, parse_config
from gateway.outcomes.traffic_sample import ExactCounter, Placeholders, Recorder, redact_body
from tooling.bench import BenchOptions, run_bench
from tooling.bench.plan import load_jsonl, poisson_offsets, replay_offsets
from tooling.loadgen import send_one
from tooling.local_stack import MODEL, local_stack
from tooling.workloads import Request, build

SECRET = "Zanzibar-7731"  # in every original prompt; must be in no recorded line


def _originals() -> list[Request]:
    reqs = build(["structured", "code", "creative", "rag", "sql"], 1, model=MODEL, seed=3)
    out = []
    for r in reqs:
        body = json.loads(json.dumps(r.body))
        body["messages"][0]["content"] += f" (ref {SECRET})"
        body["messages"].insert(0, {"role": "system", "content": f"You are {SECRET}'s helper."})
        body["user"] = "customer-42"
        out.append(Request(r.workload, r.endpoint, body))
    return out


async def test_record_redact_then_replay_with_timing(tmp_path: Path, tokens: TokenCounter) -> None:
    recording = tmp_path / "requests.jsonl"
    originals = _originals()
    async with (
        local_stack(
            time_scale=0.1, tokens=tokens, record={"path": str(recording), "sample_rate": 1.0}
        ) as stack,
        aiohttp.ClientSession() as session,
    ):
        for request in originals:
            assert (await send_one(session, stack.gateway, request)).ok
            await asyncio.sleep(0.05)  # paced on purpose: the recorded timing is replayed
    exact = ExactCounter(tokens)
    lines = [json.loads(line) for line in recording.read_text().splitlines()]
    assert len(lines) == len(originals)
    assert SECRET not in recording.read_text() and "lighthouse" not in recording.read_text()
    assert "customer-42" not in recording.read_text()
    times = [line["t"] for line in lines]
    assert times == sorted(times) and times[-1] - times[0] >= 0.2
    for original, line in zip(originals, lines, strict=True):
        assert line["redaction"] == "placeholders" and line["endpoint"] == "chat"
        assert isinstance(line["ts"], float)
        body = line["body"]
        for before, after in zip(original.body["messages"], body["messages"], strict=True):
            assert before["role"] == after["role"]
            assert exact.count(before["content"]) == exact.count(after["content"])
        for key in ("response_format", "temperature", "max_tokens", "model"):
            assert body.get(key) == original.body.get(key)
        assert body["stream"] is True  # as the client (loadgen) sent it
        want = extract_features({**original.body, "stream": True}, Endpoint.CHAT, tokens)
        got = extract_features(body, Endpoint.CHAT, tokens)
        # The router sees the same request (its counter samples texts of many KiB,
        # so a long prompt's estimate may differ, within the 10% the README
        # promises: the placeholder words are salted per process, and a 5% bound
        # failed 3 runs in 8; the real count does not differ).
        assert replace(got, prompt_tokens=0) == replace(want, prompt_tokens=0)
        assert got.prompt_tokens == pytest.approx(want.prompt_tokens, rel=0.10)
        assert line["workload"] == want.workload.value

    replayed = load_jsonl(recording, tokens)
    assert [r.workload for r in replayed] == [line["workload"] for line in lines]
    offsets = replay_offsets(replayed, 0.5)
    assert offsets[0] == 0.0
    assert offsets[-1] == pytest.approx((times[-1] - times[0]) * 0.5)

    async with local_stack(time_scale=0.1, tokens=tokens) as stack:
        targets = {"baseline": stack.baseline, "speculative": stack.speculative}
        opts = BenchOptions(
            targets={**targets, "gateway": stack.gateway},
            workload=str(recording),
            replay_timing=True,
            time_scale=0.5,
        )
        outcome = await run_bench(opts, out=io.StringIO())
    doc = outcome.doc
    assert outcome.failures == 0 and doc["mode"] == "replay" and doc["time_scale"] == 0.5
    assert [c["group"] for c in doc["cells"]] == ["recorded"]
    assert {r["workload"] for r in doc["rows"]} == {line["workload"] for line in lines}
    assert doc["overall"][0]["load"]["label"] == "replay x0.5"
    assert doc["overall"][0]["acceptance"]["counters"] is not None
    assert doc["regret"] is not None


def test_placeholders_keep_token_counts_and_code_marks(tokens: TokenCounter) -> None:
    p = Placeholders(tokens, salt=b"fixed")
    exact = ExactCounter(tokens)
    rng = random.Random(0)
    samples = ["", "hi", "Hello, world!", "x" * 700, "naïve café ☕ " * 40]
    samples += ["def f(x):\n    return x\n", "SELECT a FROM t WHERE b > 2", "```js\nlet a\n```"]
    samples += [" ".join(rng.choice(["ab", "Cd", "1234", "!?", "\n"]) for _ in range(300))]
    samples += [" ".join(rng.choice(["word", "Other", "x1", "-", "\n\n"]) for _ in range(9000))]
    for text in samples:
        out = p.replace(text)
        assert exact.count(out) == exact.count(text), text[:80]
        assert p.replace(text) == out  # the same text, the same placeholder
        want = extract_features(
            {"messages": [{"role": "user", "content": text}]}, Endpoint.CHAT, tokens
        )
        got = extract_features(
            {"messages": [{"role": "user", "content": out}]}, Endpoint.CHAT, tokens
        )
        assert got.code_like == want.code_like


def test_redaction_covers_completions_tools_and_parts(tokens: TokenCounter) -> None:
    p = Placeholders(tokens)
    body: dict[str, Any] = {
        "prompt": ["secret one", [1, 2, 3]],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "secret two"}]},
            {
                "role": "assistant",
                "tool_calls": [{"function": {"name": "f", "arguments": '{"q": "secret three"}'}}],
            },
        ],
        "tools": [
            {
                "type": "function",
                "function": {"name": "f", "description": "secret four", "parameters": {}},
            }
        ],
    }
    out = redact_body(body, "completions", p)
    assert "secret" not in json.dumps(out)
    assert out["prompt"][1] == [0, 0, 0]
    assert out["tools"][0]["function"]["name"] == "f"
    assert tokens.count(
        out["messages"][1]["tool_calls"][0]["function"]["arguments"]
    ) == tokens.count('{"q": "secret three"}')
    assert body["prompt"][0] == "secret one"  # the caller's body is untouched


def test_sampling_and_off_mode(tmp_path: Path, tokens: TokenCounter) -> None:
    sampled = Recorder(tmp_path / "s.jsonl", tokens, sample_rate=0.25, seed=7)
    verbatim = Recorder(tmp_path / "v.jsonl", tokens, redaction="off")
    body = {"messages": [{"role": "user", "content": "plain words"}]}
    for i in range(200):
        sampled.offer(body, "chat", float(i), "chat")
        verbatim.offer(body, "chat", float(i), "chat")
    sampled.close()
    verbatim.close()
    assert 20 < len((tmp_path / "s.jsonl").read_text().splitlines()) < 80
    lines = (tmp_path / "v.jsonl").read_text().splitlines()
    assert len(lines) == 200 and json.loads(lines[0])["body"] == body


def test_record_config_is_validated() -> None:
    backends = {"speculative": {"urls": ["http://a:1"]}, "baseline": {"urls": ["http://b:1"]}}
    assert parse_config({"backends": backends}).record.path == ""  # off by default
    for bad in ({"sample_rate": 0.0}, {"sample_rate": 1.5}, {"redaction": "hash"}):
        with pytest.raises(ConfigError, match="record"):
            parse_config({"backends": backends, "record": bad})


def test_poisson_arrivals_are_seeded() -> None:
    a, b = poisson_offsets(2000, 10.0, seed=1), poisson_offsets(2000, 10.0, seed=1)
    assert a == b and a[0] == 0.0 and a == sorted(a)
    assert poisson_offsets(2000, 10.0, seed=2) != a
    gaps = [y - x for x, y in itertools.pairwise(a)]
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.1)
    # Exponential gaps: their standard deviation is their mean.
    mean = sum(gaps) / len(gaps)
    std = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert std == pytest.approx(mean, rel=0.15)
