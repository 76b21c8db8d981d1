"""The speculative-decoding arithmetic of Leviathan et al. 2023 ("Fast Inference
from Transformers via Speculative Decoding"), in plain floats.

`a` here is the per-position acceptance probability of the paper (each draft
token is accepted with probability a, independently, and verification stops at
the first rejection); it is also what the emulator's `acceptance_*` knobs set.
vLLM's own "acceptance rate" is something else: accepted / proposed draft
tokens, which for the same a is smaller (a=0.8, k=4 gives 0.59). The two are
converted here, in one place, so the rest of the classifier never mixes them.

These run on the decision path, so they are closed forms (one pow), no numpy.
"""

from __future__ import annotations

import math

__all__ = [
    "acceptance_rate",
    "alpha_from_rate",
    "decode_speedup",
    "expected_tokens_per_step",
]

# Within this distance of 1 the closed form loses digits to cancellation
# (1 - a^(k+1) and 1 - a both vanish), so the sum is added up term by term.
_NEAR_ONE = 1e-3


def expected_tokens_per_step(a: float, k: int) -> float:
    """Expected tokens one target step yields: 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a),
    the target's own token plus each accepted draft; a clamped into [0, 1]."""
    if k <= 0 or a <= 0.0 or math.isnan(a):
        return 1.0
    if a >= 1.0:
        return float(k + 1)
    if a > 1.0 - _NEAR_ONE:
        total, term = 1.0, 1.0
        for _ in range(k):
            term *= a
            total += term
        return total
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def decode_speedup(a: float, k: int, c: float) -> float:
    """Decode speedup over the plain target: tokens per step / (k*c + 1).

    c is the cost of one draft forward pass relative to one target step; a
    speculative step runs k of them before the target's verification pass.
    Below 1 speculation is slower (low acceptance, or an expensive draft).
    """
    return expected_tokens_per_step(a, k) / (max(k, 0) * max(c, 0.0) + 1.0)


def acceptance_rate(a: float, k: int) -> float:
    """vLLM's measure for per-position acceptance a: accepted / proposed drafts (tokens
    per step less the target's own one, out of k)."""
    if k <= 0:
        return 0.0
    return (expected_tokens_per_step(a, k) - 1.0) / k


def alpha_from_rate(rate: float, k: int) -> float:
    """Invert acceptance_rate (strictly increasing in a): 40 halvings reach 1e-12, once
    per observed request, never on the decision path. The rate is clamped into [0, 1]."""
    if k <= 1 or math.isnan(rate):
        return min(1.0, max(0.0, 0.0 if math.isnan(rate) else rate))
    if rate <= 0.0:
        return 0.0
    if rate >= 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if acceptance_rate(mid, k) < rate:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
