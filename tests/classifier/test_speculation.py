"""speculation.py: Leviathan et al.'s formulas, their limits, and the rate <-> a conversion."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from classifier.speculation import (
    acceptance_rate,
    alpha_from_rate,
    decode_speedup,
    expected_tokens_per_step,
)

SETTINGS = settings(max_examples=200, deadline=None, database=None)
probability = st.floats(0.0, 1.0)
ks = st.integers(1, 16)


@pytest.mark.parametrize(
    ("a", "k", "tokens"),
    [
        (0.0, 4, 1.0),
        (0.5, 1, 1.5),
        (0.5, 4, 1.9375),  # 1 + .5 + .25 + .125 + .0625
        (0.8, 4, 3.3616),  # (1 - .8^5) / .2
        (0.6, 5, (1 - 0.6**6) / 0.4),
        (1.0, 4, 5.0),
        (1.0, 0, 1.0),
    ],
)
def test_expected_tokens_per_step_known_values(a: float, k: int, tokens: float) -> None:
    assert expected_tokens_per_step(a, k) == pytest.approx(tokens, rel=1e-12)


def test_tokens_per_step_is_continuous_at_one() -> None:
    for k in (1, 3, 8):
        near = expected_tokens_per_step(1 - 1e-7, k)
        assert near == pytest.approx(k + 1, rel=1e-5)
        assert expected_tokens_per_step(1 - 1e-13, k) == pytest.approx(k + 1, rel=1e-12)


def test_out_of_range_acceptance_is_clamped() -> None:
    assert expected_tokens_per_step(-0.3, 4) == 1.0
    assert expected_tokens_per_step(1.7, 4) == 5.0
    assert expected_tokens_per_step(math.nan, 4) == 1.0


def test_decode_speedup_known_values() -> None:
    # The paper's example shape: a = 0.8, k = 4, draft at 5% of the target.
    assert decode_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
    assert decode_speedup(1.0, 4, 0.0) == 5.0
    # No acceptance: every step pays the draft for nothing.
    assert decode_speedup(0.0, 4, 0.25) == pytest.approx(0.5)


@SETTINGS
@given(a=probability, b=probability, k=ks)
def test_tokens_per_step_increases_with_acceptance(a: float, b: float, k: int) -> None:
    lo, hi = sorted((a, b))
    assert expected_tokens_per_step(lo, k) <= expected_tokens_per_step(hi, k) + 1e-12
    assert 1.0 <= expected_tokens_per_step(a, k) <= k + 1


@SETTINGS
@given(a=probability, k=ks, c1=st.floats(0, 2), c2=st.floats(0, 2))
def test_speedup_decreases_with_draft_cost(a: float, k: int, c1: float, c2: float) -> None:
    lo, hi = sorted((c1, c2))
    assert decode_speedup(a, k, hi) <= decode_speedup(a, k, lo) + 1e-12


@SETTINGS
@given(a=st.floats(0.0, 0.999), k=ks)
def test_more_draft_tokens_never_yield_fewer_tokens(a: float, k: int) -> None:
    assert expected_tokens_per_step(a, k + 1) >= expected_tokens_per_step(a, k)


def test_acceptance_rate_is_vllms_accepted_over_proposed() -> None:
    # a = 0.8, k = 4: accepted per step .8 + .64 + .512 + .4096 = 2.3616 of 4 proposed.
    assert acceptance_rate(0.8, 4) == pytest.approx(2.3616 / 4)
    assert acceptance_rate(0.7, 1) == pytest.approx(0.7)
    assert acceptance_rate(1.0, 4) == 1.0
    assert acceptance_rate(0.0, 4) == 0.0


@SETTINGS
@given(a=probability, k=ks)
def test_alpha_from_rate_inverts_acceptance_rate(a: float, k: int) -> None:
    assert alpha_from_rate(acceptance_rate(a, k), k) == pytest.approx(a, abs=1e-9)


def test_alpha_from_rate_clamps() -> None:
    assert alpha_from_rate(-0.1, 4) == 0.0
    assert alpha_from_rate(1.3, 4) == 1.0
    assert alpha_from_rate(math.nan, 4) == 0.0
