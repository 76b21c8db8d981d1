"""Time extract_features + RulesPolicy.decide per request (not a test; run by hand).

    .venv/bin/python tests/classifier/bench_features.py

"cold": every request's text is new (the token-count memo misses: a first-seen
prompt). "warm": the same text again (a resent system prompt or history).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from classifier import (
    BackendState,
    Endpoint,
    LiveState,
    RulesConfig,
    RulesPolicy,
    extract_features,
    load_tiktoken_counter,
)

WORDS = (
    "the",
    "model",
    "reads",
    "a",
    "long",
    "prompt",
    "and",
    "answers",
    "with",
    "a",
    "short",
    "summary",
    "of",
    "each",
    "section",
    "while",
    "engineers",
    "measure",
    "latency",
    "throughput",
    "acceptance",
    "rate",
    "and",
    "queueing",
    "under",
    "mixed",
    "load",
)


def prose(tokens: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(tokens))  # ~1 cl100k token a word


def body(text: str) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": text},
        ],
        "temperature": 0.2,
        "max_tokens": 512,
        "response_format": {"type": "json_object"},
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as cache:
        counter = load_tiktoken_counter(cache_dir=Path(cache))
    policy = RulesPolicy(RulesConfig())
    state = LiveState.pair(BackendState(inflight=2), BackendState(inflight=1))
    runs = 400
    for size in (200, 2000, 8000):
        cold = [body(f"[{i}] " + prose(size, i)) for i in range(runs)]
        warm = body(prose(size, -1))
        tokens = extract_features(warm, Endpoint.CHAT, counter).prompt_tokens
        for name, bodies in (("cold", cold), ("warm", [warm] * runs)):
            samples = []
            for b in bodies:
                t0 = time.perf_counter_ns()
                policy.decide(extract_features(b, Endpoint.CHAT, counter), state)
                samples.append(time.perf_counter_ns() - t0)
            p50 = statistics.median(samples) / 1000
            p99 = statistics.quantiles(samples, n=100)[98] / 1000
            print(
                f"{size:>5} words ({tokens:>5} tokens) {name}: p50 {p50:8.1f} us  p99 {p99:8.1f} us"
            )


if __name__ == "__main__":
    main()
