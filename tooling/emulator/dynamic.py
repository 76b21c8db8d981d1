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

# The key's parsing and lookup are the gateway's too ([routes.NAME]
# num_speculative_tokens_per_batch_size): they live in classifier/, the arrows going
# tooling -> classifier.
from classifier.speculation import Schedule, k_at, parse_schedule

__all__ = [
    "DEFAULT_SCHEDULE",
    "Schedule",
    "dense_lookup",
    "parse_schedule",
    "schedule_arg",
    "schedule_from_json",
    "to_json",
]

# The default when `--mode dynamic` gets no schedule: the K the emulator's own cost
# model (costs.py, CALIBRATION.md) favours per batch size for acceptance 0.6-0.8:
# full k while decoding is memory-bound, fewer drafts as the batch grows, none past
# 128 (there K=1 and K=0 are about even for mixed traffic, since a K=0 step still
# runs the draft model once).
DEFAULT_SCHEDULE: Schedule = ((1, 4, 4), (5, 8, 3), (9, 16, 2), (17, 128, 1), (129, 256, 0))


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

    vLLM's build_dynamic_sd_schedule_lookup: classifier's k_at at every size; an empty
    schedule gives max_k everywhere (vLLM's scheduler then keeps its static num_speculative_tokens).
    """
    if max_batch_size <= 0 or max_k <= 0:
        raise ValueError("max_batch_size and max_k must be > 0")
    if not schedule:
        return [max_k] * (max_batch_size + 1)
    return [0] + [k_at(schedule, size, max_k) for size in range(1, max_batch_size + 1)]


def to_json(schedule: Schedule) -> str:
    """The schedule as vLLM's --speculative-config spells it."""
    return json.dumps([list(e) for e in schedule], separators=(", ", ": "))
