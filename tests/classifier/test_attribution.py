"""Counter attribution: per-workload acceptance from server-wide counter deltas.

Synthetic engines stand in for vLLM: every decoding sequence drafts k tokens
per step, so the truth is known and each property is checked against it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from classifier.attribution import CounterAttribution, DecodeLog

KEYS = ("structured", "code", "chat", "creative", "long_context")
K = 4


def test_one_request_in_flight_is_exact() -> None:
    est = CounterAttribution(KEYS, max_stderr=math.inf)
    # Windows of one workload each, whatever the order: each rate is accepted/drafted.
    for drafted, accepted, key in (
        (400, 320, "structured"),
        (200, 60, "creative"),
        (800, 640, "structured"),
        (120, 36, "creative"),
    ):
        assert est.observe(drafted, accepted, {key: 1.7})
    structured, creative = est.estimate("structured"), est.estimate("creative")
    assert structured is not None and creative is not None
    assert structured.rate == pytest.approx(960 / 1200, abs=1e-12)
    assert creative.rate == pytest.approx(96 / 320, abs=1e-12)
    # With one workload per window the support is its drafted tokens (faded a little).
    assert structured.support == pytest.approx(1200, rel=0.01)
    assert est.estimate("chat") is None  # never seen


def test_a_rate_needs_enough_drafted_tokens() -> None:
    # Noise alone (1.0 per drafted token at k=4): a standard error of 0.03 needs
    # 1111 drafted tokens behind the rate.
    est = CounterAttribution(KEYS)
    for _ in range(2):
        est.observe(400, 300, {"code": 1.0})
    assert est.estimate("code") is None and not est.ready
    est.observe(400, 300, {"code": 1.0})
    estimate = est.estimate("code")
    assert estimate is not None and est.ready
    assert estimate.rate == pytest.approx(0.75)
    assert estimate.stderr == pytest.approx(1 / math.sqrt(1200), rel=0.01)


def test_windows_that_fit_badly_need_more_evidence() -> None:
    # The same drafted tokens, but windows that disagree far beyond noise (0.2 and
    # 0.9 of the same key): the residual variance widens the standard error.
    steady, erratic = CounterAttribution(KEYS), CounterAttribution(KEYS)
    for i in range(8):
        steady.observe(400, 220, {"chat": 1.0})
        erratic.observe(400, 80 if i % 2 else 360, {"chat": 1.0})
    calm, noisy = steady.estimate("chat"), erratic.estimate("chat")
    assert calm is not None and noisy is None
    assert erratic.support("chat") == pytest.approx(steady.support("chat"))


@dataclass
class _Seq:
    key: str
    steps_left: int
    sequences: int


def _simulate(
    rates: dict[str, float], *, concurrency: int, windows: int, steps_per_window: int, seed: int
) -> tuple[CounterAttribution, dict[str, float]]:
    """A continuous-batching engine: `concurrency` requests always decoding (a new one
    replaces each that ends), each step every sequence drafts K tokens and accepts
    each in order with its workload's per-position probability. Times are steps."""
    rng = random.Random(seed)
    est = CounterAttribution(KEYS)
    log = DecodeLog()
    handles: dict[int, _Seq] = {}
    drafted_by = dict.fromkeys(rates, 0.0)
    accepted_by = dict.fromkeys(rates, 0.0)
    step = 0

    def admit() -> None:
        key = rng.choice(list(rates))
        seq = _Seq(key, rng.randint(5, 60), rng.choice((1, 1, 1, 2)))
        handles[log.begin(key, seq.sequences, float(step))] = seq

    for _ in range(concurrency):
        admit()
    for w in range(windows):
        drafted = accepted = 0
        for _ in range(steps_per_window):
            for seq in handles.values():
                for _ in range(seq.sequences):
                    a = 0
                    while a < K and rng.random() < rates[seq.key]:
                        a += 1
                    drafted += K
                    accepted += a
                    drafted_by[seq.key] += K
                    accepted_by[seq.key] += a
                seq.steps_left -= 1
            step += 1
            for handle, seq in list(handles.items()):
                if seq.steps_left <= 0:
                    log.end(handle, float(step))
                    del handles[handle]
                    admit()
        decode_s = log.take(float(w * steps_per_window), float(step))
        assert decode_s is not None
        assert est.observe(drafted, accepted, decode_s)
    truth = {k: accepted_by[k] / drafted_by[k] for k in rates if drafted_by[k]}
    return est, truth


@pytest.mark.parametrize("concurrency", [4, 16])
def test_mixed_concurrent_workloads_are_recovered(concurrency: int) -> None:
    alphas = {"structured": 0.85, "code": 0.3, "chat": 0.55, "creative": 0.2}
    est, truth = _simulate(
        alphas, concurrency=concurrency, windows=400, steps_per_window=20, seed=concurrency
    )
    for key, rate in truth.items():
        estimate = est.estimate(key)
        assert estimate is not None, key
        assert abs(estimate.rate - rate) < 0.04, (key, estimate.rate, rate)
    assert est.estimate("long_context") is None  # no traffic: no claim


def test_workloads_always_together_in_the_same_proportion_are_not_identified() -> None:
    est = CounterAttribution(KEYS)
    for _ in range(50):
        est.observe(1000, 500, {"chat": 1.0, "code": 1.0})
    # Any split of 0.5 between them fits: the support says so and nothing is claimed.
    assert est.estimate("chat") is None and est.estimate("code") is None
    for _ in range(2):  # windows of code alone separate them
        est.observe(1000, 900, {"code": 1.0})
    code, chat = est.estimate("code"), est.estimate("chat")
    assert code is not None and chat is not None
    assert code.rate == pytest.approx(0.9, abs=1e-6)
    assert chat.rate == pytest.approx(0.1, abs=1e-6)


@pytest.mark.parametrize(
    ("drafted", "accepted", "decode_s"),
    [
        (-400, -100, {"chat": 1.0}),  # a counter reset read as a delta
        (400, -10, {"chat": 1.0}),
        (400, 500, {"chat": 1.0}),  # more accepted than drafted: not one server's counters
        (0, 0, {"chat": 1.0}),
        (math.nan, 1, {"chat": 1.0}),
        (400, 100, {}),  # nothing of ours decoding: nobody to attribute to
        (400, 100, {"chat": 0.0}),
        (400, 100, {"chat": -1.0}),
        (400, 100, {"chat": 1.0, "someone-else": 1.0}),  # would land on chat
    ],
)
def test_windows_that_cannot_be_attributed_teach_nothing(
    drafted: float, accepted: float, decode_s: dict[str, float]
) -> None:
    est = CounterAttribution(KEYS, max_stderr=math.inf)
    est.observe(1000, 700, {"chat": 1.0})
    assert not est.observe(drafted, accepted, decode_s)
    estimate = est.estimate("chat")
    assert estimate is not None and estimate.rate == pytest.approx(0.7)


def test_old_windows_fade() -> None:
    est = CounterAttribution(KEYS, memory_draft_tokens=10_000, max_stderr=math.inf)
    for _ in range(100):
        est.observe(1000, 800, {"code": 1.0})
    est_code = est.estimate("code")
    assert est_code is not None and est_code.rate == pytest.approx(0.8)
    # The draft model changed: within a few memories the estimate is the new rate.
    for _ in range(40):
        est.observe(1000, 300, {"code": 1.0})
    est_code = est.estimate("code")
    assert est_code is not None and est_code.rate == pytest.approx(0.3, abs=0.01)
    # The support is bounded by the memory (plus the window that fades it), however
    # many windows came: sum of 1000 x exp(-i/10) is 10.5k.
    assert est_code.support < 10_000 * 1.06


def test_the_state_is_bounded_whatever_the_number_of_windows() -> None:
    est = CounterAttribution(KEYS)
    log = DecodeLog(max_finished=64)
    for i in range(5000):
        handle = log.begin(KEYS[i % 5], 1, float(i))
        log.end(handle, i + 0.5)
        if i % 10 == 9:
            decode_s = log.take(i - 9.0, i + 1.0)
            assert decode_s is not None
            est.observe(400, 200, decode_s)
    assert len(log) == 0
    # Attribution state: a K x K matrix and K-vectors, no per-window history.
    assert len(est._m) == len(KEYS) and all(len(row) == len(KEYS) for row in est._m)


def test_the_decode_log_drops_a_window_rather_than_attribute_part_of_it() -> None:
    log = DecodeLog(max_finished=3)
    for i in range(5):
        log.end(log.begin("chat", 1, float(i)), i + 1.0)
    assert len(log) == 3  # bounded
    assert log.take(0.0, 10.0) is None  # intervals were dropped: the window is lost
    log.end(log.begin("chat", 1, 20.0), 21.0)
    assert log.take(10.0, 30.0) == {"chat": 1.0}  # and the next one is whole again


def test_the_decode_log_counts_decoding_time_only() -> None:
    log = DecodeLog()
    stream = log.begin("chat", 1)  # a stream: prefilling until its first token
    whole = log.begin("code", 2, 0.0)  # a whole answer with n=2, decoding since sent
    assert log.take(0.0, 1.0) == {"code": 2.0}
    log.decoding(stream, 1.5)
    log.decoding(stream, 1.8)  # the first token only counts once
    log.end(whole, 2.5)
    assert log.take(1.0, 3.0) == {"chat": 1.5, "code": 3.0}
    failed = log.begin("creative", 1)
    log.end(failed, 3.5)  # ended before any token: it drafted nothing
    log.end(stream, 4.0)
    assert log.take(3.0, 5.0) == {"chat": 1.0}
    assert len(log) == 0


def test_keys_must_be_distinct() -> None:
    with pytest.raises(ValueError):
        CounterAttribution(("chat", "chat"))
    with pytest.raises(ValueError):
        CounterAttribution(KEYS, memory_draft_tokens=0)
    with pytest.raises(ValueError):
        CounterAttribution(KEYS, max_stderr=0)
