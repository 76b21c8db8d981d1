"""The speculative-decoding arithmetic of Leviathan et al. 2023 ("Fast Inference
from Transformers via Speculative Decoding"), in plain floats.

`a` here is the per-position acceptance probability of the paper (each draft
token is accepted with probability a, independently, and verification stops at
the first rejection); it is also what the emulator's `acceptance_*` knobs set.
vLLM's own "acceptance rate" is something else: accepted / proposed draft
tokens, which for the same a is smaller (a=0.8, k=4 gives 0.59). The two are
converted here, in one place, so the rest of the classifier never mixes them.

These run on the decision path, so they are closed forms (one pow), no numpy.

A dynamic-speculation server (vLLM's `num_speculative_tokens_per_batch_size` in
--speculative-config) proposes K drafts by its batch size, every step: parse_schedule
reads the key as vLLM validates it, k_at looks K up as vLLM's scheduler does.
"""

from __future__ import annotations

import math

__all__ = [
    "Schedule",
    "acceptance_rate",
    "alpha_from_rate",
    "decode_speedup",
    "expected_tokens_per_step",
    "k_at",
    "parse_schedule",
]

# vLLM's num_speculative_tokens_per_batch_size: inclusive batch-size ranges and their K,
# [(range_start, range_end, K), ...], sorted by start.
Schedule = tuple[tuple[int, int, int], ...]

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


def _as_int(value: object) -> int:
    """An int as pydantic's lax mode reads one (vLLM's config is a pydantic dataclass)."""
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ValueError(f"num_speculative_tokens_per_batch_size: {value!r} is not an integer")


def parse_schedule(raw: object) -> Schedule:
    """Validate and sort a schedule (vLLM 0.32's validate_and_normalize_dynamic_sd_schedule):
    3-item entries, starts and ends > 0, start <= end, K >= 0, no overlap, the first
    starting at 1. An empty list is returned as is: vLLM accepts it and runs static K."""
    if isinstance(raw, tuple):
        raw = list(raw)
    if not isinstance(raw, list):
        raise ValueError(
            "num_speculative_tokens_per_batch_size must be a non-empty list of "
            "(range_start, range_end, num_speculative_tokens) entries."
        )
    parsed: list[tuple[int, int, int]] = []
    for entry in raw:
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            raise ValueError(
                "Each num_speculative_tokens_per_batch_size entry must be a "
                "3-item sequence: (range_start, range_end, num_speculative_tokens)."
            )
        start, end, k = (_as_int(v) for v in entry)
        if start <= 0 or end <= 0:
            raise ValueError(f"Batch-size range ({start}, {end}) must be positive.")
        if start > end:
            raise ValueError(f"Batch-size range start must be <= end for ({start}, {end}, {k}).")
        if k < 0:
            raise ValueError("num_speculative_tokens_per_batch_size values must be >= 0.")
        parsed.append((start, end, k))
    parsed.sort(key=lambda e: e[0])
    previous_end = 0
    for start, end, _ in parsed:
        if start <= previous_end:
            raise ValueError("Batch-size ranges must be non-overlapping and sorted.")
        previous_end = end
    if parsed and parsed[0][0] != 1:
        raise ValueError(
            "The first batch-size range must start at 1 so every runtime "
            "batch size has a defined schedule."
        )
    return tuple(parsed)


def k_at(schedule: Schedule, batch: float, k: int) -> int:
    """The K a server of most k drafts proposes at this batch size (vLLM's dense lookup,
    build_dynamic_sd_schedule_lookup): the range's K, clamped to k; in a gap between
    ranges the range's before it, past the last range the last one's; an empty schedule
    (static speculation) k. A batch under 1 is a batch of 1."""
    if not schedule:
        return k
    size = max(int(batch), 1)
    found = schedule[0][2]
    for start, _, drafts in schedule:
        if start > size:
            break
        found = drafts
    return min(found, k)
