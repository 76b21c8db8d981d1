"""Latency targets per request (llm-d's SLO headers), and the pick among routes they make.

A request may say how soon its first token must come (TTFT) and how fast the tokens
after it (TPOT, time per output token). The cost model predicts both per route
(classifier/cost.py Prediction): TTFT is `first_token_s` (the queue and the prefill),
TPOT the rest of the predicted time over the tokens after the first:

    tpot_r = (e2e_r - first_token_r) / max(decode_steps_r * tokens_per_step_r, 1)

(decode_steps * tokens_per_step is the predicted answer less its first token, so this
is what the gateway measures of an answer: (duration - ttft) / (tokens - 1).)

The pick: among the routes predicted to meet every target, the one that costs the
system least (the one cost model's cost); none predicted to meet them, the one that
comes closest, by its worst ratio of predicted to target (ties: the cheaper), and the
answer says so. No target: the cheapest, as without this module. A target moves a
request only among the routes whose cost is within `max_regret` of the cheapest
(the router passes explore_max_regret, 25%: the most one request's exploration may
cost): on one time-sliced GPU a move off the batch's server slows every request on
it, and a target met at that price is paid for by the others' (benchmarks/slo.py).

Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from classifier.cost import Prediction

__all__ = ["LatencyTargets", "Pick", "pick", "predicted_tpot_s"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LatencyTargets:
    """What one request asks: seconds to its first token, seconds per output token after
    it (None: no such target). Built from the headers or the model's configured default."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")

    @property
    def any(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None

    def shortfall(self, prediction: Prediction) -> float:
        """The worst ratio of predicted to target over the targets set (<= 1: predicted
        to meet them all; 0 with none)."""
        ratios = [0.0]
        if self.ttft_s is not None:
            ratios.append(prediction.first_token_s / self.ttft_s)
        if self.tpot_s is not None:
            ratios.append(predicted_tpot_s(prediction) / self.tpot_s)
        return max(ratios)

    def as_dict(self) -> dict[str, float]:
        """The targets set, in ms (the headers' unit), for a log line and /decide."""
        out: dict[str, float] = {}
        if self.ttft_s is not None:
            out["ttft_ms"] = round(self.ttft_s * 1000.0, 3)
        if self.tpot_s is not None:
            out["tpot_ms"] = round(self.tpot_s * 1000.0, 3)
        return out


def predicted_tpot_s(prediction: Prediction) -> float:
    """Predicted seconds per output token after the first (the module's docstring)."""
    after_first = prediction.decode_steps * prediction.tokens_per_step
    return max(prediction.e2e_s - prediction.first_token_s, 0.0) / max(after_first, 1.0)


@dataclass(frozen=True, slots=True)
class Pick(Generic[T]):
    """The chosen route (the cheapest allowed), the routes the targets allow (a picker
    that explores draws among them only), and whether it is predicted to meet them."""

    route: T
    allowed: tuple[T, ...]
    met: bool


def pick(
    routes: Sequence[T],
    predicted: Mapping[T, Prediction],
    cost: Mapping[T, float],
    targets: LatencyTargets | None,
    max_regret: float = math.inf,
) -> Pick[T]:
    """Of `routes` (non-empty) within `max_regret` of the cheapest cost, those predicted
    to meet every target, and the cheapest of them; none meets them: the closest alone
    (its worst predicted / target the smallest, the cheaper of equals), met False. No
    target: every route, met."""
    if not routes:
        raise ValueError("pick: no route to pick from")
    allowed = tuple(routes)
    if targets is not None and targets.any:
        limit = (1.0 + max_regret) * min(cost[r] for r in routes)
        near = [r for r in routes if cost[r] <= limit]
        allowed = tuple(r for r in near if targets.shortfall(predicted[r]) <= 1.0)
        if not allowed:
            closest = min(near, key=lambda r: (targets.shortfall(predicted[r]), cost[r]))
            return Pick(closest, (closest,), False)
    return Pick(min(allowed, key=cost.__getitem__), allowed, True)
