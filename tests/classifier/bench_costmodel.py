"""Time extract_features + CostModelPolicy.decide, and decide alone (not a test; run by hand).

    .venv/bin/python tests/classifier/bench_costmodel.py

The policy is first trained on a few thousand simulated outcomes so that its
tables hold every key (a cold policy skips lookups and would look faster).
"cold" features: every request's text is new (the token-count memo misses);
"warm": the same text again (a resent system prompt or history).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from bench_features import body, prose
from costmodel_sim import Engine, mixed_requests, simulate

from classifier import BackendState, Endpoint, LiveState, extract_features, load_tiktoken_counter
from classifier.costmodel import CostModelConfig, CostModelPolicy, Observation


def percentiles(samples: list[int]) -> str:
    p50 = statistics.median(samples) / 1000
    p99 = statistics.quantiles(samples, n=100)[98] / 1000
    return f"p50 {p50:7.2f} us  p99 {p99:7.2f} us"


def main() -> None:
    with tempfile.TemporaryDirectory() as cache:
        counter = load_tiktoken_counter(cache_dir=Path(cache))
    policy = CostModelPolicy(CostModelConfig(draft_cost_ratio=0.2))
    served = simulate(Engine(), policy, mixed_requests(3000, 7), 8)
    state = LiveState(BackendState(inflight=2, running=3), BackendState(inflight=1, waiting=0))
    runs = 2000

    bodies = [body(f"[{i}] " + prose(2000, i)) for i in range(runs)]
    tokens = extract_features(bodies[0], Endpoint.CHAT, counter).prompt_tokens
    samples = []
    for b in bodies:
        t0 = time.perf_counter_ns()
        policy.decide(extract_features(b, Endpoint.CHAT, counter), state)
        samples.append(time.perf_counter_ns() - t0)
    print(f"features + decide, 2000 words ({tokens} tokens), cold: {percentiles(samples)}")
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        policy.decide(extract_features(bodies[0], Endpoint.CHAT, counter), state)
        samples.append(time.perf_counter_ns() - t0)
    print(f"features + decide, 2000 words ({tokens} tokens), warm: {percentiles(samples)}")

    feats = [extract_features(b, Endpoint.CHAT, counter) for b in bodies[:200]]
    feats += [s.features for s in served[:1800]]
    samples = []
    for f in feats * 5:
        t0 = time.perf_counter_ns()
        policy.decide(f, state)
        samples.append(time.perf_counter_ns() - t0)
    print(f"decide alone:                                {percentiles(samples)}")

    obs = [
        Observation(
            s.route,
            s.features,
            3,
            None,
            s.outcome.ttft_s,
            s.outcome.duration_s,
            s.features.prompt_tokens,
            s.outcome.completion_tokens,
            s.outcome.acceptance,
            s.predicted_s,
        )
        for s in served[:2000]
    ]
    samples = []
    for o in obs:
        t0 = time.perf_counter_ns()
        policy.observe(o)
        samples.append(time.perf_counter_ns() - t0)
    print(f"observe (off the decision path):             {percentiles(samples)}")


if __name__ == "__main__":
    main()
