"""Dynamic speculative decoding as vLLM 0.32 runs it: K from the batch size, every step.

vLLM's SpeculativeConfig field `num_speculative_tokens_per_batch_size`
(config/speculative.py) is a list of inclusive ranges
`[(range_start, range_end, K), ...]`, given as JSON lists inside
`--speculative-config`. The scheduler expands it once into a dense lookup
indexed by batch size (vllm/v1/spec_decode/dynamic/utils.py,
build_dynamic_sd_schedule_lookup); then, every step, K is
`lookup[number of requests scheduled in this step]` (v1/core/sched/scheduler.py,
"Dynamic speculative decoding: compute optimal K"), and the drafter proposes
that many tokens per request for the NEXT step to verify. K = 0 proposes no
drafts, so the next step verifies none and the spec-decode counters do not move.

The rules this module copies, in vLLM's words where they are vLLM's:
- an entry is a 3-item sequence; starts and ends are > 0, start <= end, K >= 0;
- entries are sorted by start, must not overlap, and the first must start at 1;
- K is clamped to the configured num_speculative_tokens;
- a batch size in a gap between two ranges takes the K of the range before it,
  and one past the last range takes the last range's K;
- ranges past max_num_seqs are cut off;
- an empty list passes vLLM's config but the scheduler ignores it (`if schedule:`),
  so every step then drafts num_speculative_tokens, as a static server.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

Schedule = tuple[tuple[int, int, int], ...]

# The default when `--mode dynamic` gets no schedule: the K the emulator's own cost
# model (costs.py, CALIBRATION.md) favours per batch size for acceptance 0.6-0.8:
# full k while decoding is memory-bound, fewer drafts as the batch grows, none past
# 128 (there K=1 and K=0 are about even for mixed traffic, since a K=0 step still
# runs the draft model once).
DEFAULT_SCHEDULE: Schedule = ((1, 4, 4), (5, 8, 3), (9, 16, 2), (17, 128, 1), (129, 256, 0))


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
    """Validate and sort a schedule (vLLM's validate_and_normalize_dynamic_sd_schedule).

    An empty list is returned as is: vLLM accepts it and then runs static K.
    """
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


def schedule_from_json(text: str) -> Schedule:
    """The CLI's reading of --num-speculative-tokens-per-batch-size: JSON, as vLLM takes it."""
    try:
        raw: Any = json.loads(text)
    except ValueError as exc:
        raise ValueError(
            f"num_speculative_tokens_per_batch_size: not JSON ({exc}); "
            "e.g. '[[1, 4, 4], [5, 16, 2], [17, 256, 0]]'"
        ) from None
    return parse_schedule(raw)


def schedule_arg(text: str) -> Schedule:
    """argparse `type=` for a schedule flag: a bad value is a usage error naming the rule."""
    try:
        return schedule_from_json(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def dense_lookup(schedule: Schedule, max_batch_size: int, max_k: int) -> list[int]:
    """K for every batch size 1..max_batch_size (index 0 unused), as vLLM's scheduler holds it.

    vLLM's build_dynamic_sd_schedule_lookup, step for step; an empty schedule gives
    max_k everywhere (vLLM's scheduler then keeps its static num_speculative_tokens).
    """
    if max_batch_size <= 0 or max_k <= 0:
        raise ValueError("max_batch_size and max_k must be > 0")
    if not schedule:
        return [max_k] * (max_batch_size + 1)
    dense = [0] * (max_batch_size + 1)
    next_size = 1
    last_k: int | None = None
    for start, end, k in schedule:
        if start > next_size and last_k is not None:
            for size in range(next_size, min(start, max_batch_size + 1)):
                dense[size] = min(max_k, last_k)  # a gap carries the previous K forward
        for size in range(max(start, next_size), min(end, max_batch_size) + 1):
            dense[size] = min(max_k, k)
        next_size = max(next_size, end + 1)
        last_k = k
        if next_size > max_batch_size:
            break
    assert last_k is not None
    for size in range(next_size, max_batch_size + 1):
        dense[size] = min(max_k, last_k)  # past the last range: its K
    return dense


def to_json(schedule: Schedule) -> str:
    """The schedule as vLLM's --speculative-config spells it."""
    return json.dumps([list(e) for e in schedule], separators=(", ", ": "))
