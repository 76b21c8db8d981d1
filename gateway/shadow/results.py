"""What a finished shadow copy leaves behind: its pair's figures, a lesson, a log line.

A pair (a user request and its shadow) is the same request on two routes: the one
chosen and another (with more than two routes, one of the others, drawn). It
measures the regret of the choice (the chosen route's e2e / the faster one's)
and, where one of the two speculates and the other does not, the speedup of
speculation (the plain route's e2e / the speculative one's), only when it is comparable:
the user request ran alone on its GPU (nothing else in flight as it was sent and
as it ended) and the shadow produced as many tokens. The shadow always runs
alone (idle time only). Incomparable pairs still teach the latency fits, each
side at the load it met.

Each shadow that ran leaves one line, `"kind": "shadow"`, with timings and
token counts only (no prompt, no answer), in the outcome log's sibling file
(`shadow_log_path`: outcomes.jsonl -> outcomes.shadows.jsonl, rotated alike):
the outcome log itself stays one line per user request, as `specroute train`,
`advise` and people's own scripts read it; `specroute advise` reads both.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from classifier.features import Workload
from classifier.types import LiveState, Route
from gateway.outcomes.accounting import rounded
from gateway.shadow.copy import Primary, ShadowAnswer
from gateway.telemetry import Metrics
from gateway.wire.life import Lesson

# The sides a pair's seconds are summed on: speculative and baseline only for a pair of a
# speculating route and a plain one (the speedup's), chosen and faster for every pair.
SIDES = ("speculative", "baseline", "chosen", "faster")


def shadow_log_path(outcome_log: Path) -> Path:
    """Where the shadows' lines go beside an outcome log (and a rotated one's)."""
    name = outcome_log.name
    if ".jsonl" in name:
        return outcome_log.with_name(name.replace(".jsonl", ".shadows.jsonl", 1))
    return outcome_log.with_name(name + ".shadows")


@dataclass(frozen=True, slots=True)
class PairedTiming:
    """One comparable pair: the request's e2e on the chosen route and on another.
    `speculated`: which of the two speculates when exactly one does (None: both or
    neither, no speedup of speculation to read)."""

    chosen: Route
    chosen_s: float
    other: Route
    other_s: float
    speculated: Route | None = None

    @classmethod
    def of(
        cls,
        chosen: Route,
        chosen_s: float,
        other: Route,
        other_s: float,
        speculative: Container[Route],
    ) -> PairedTiming:
        """From the user request's route and e2e, its copy's, and which routes speculate."""
        spec = [r for r in (chosen, other) if r in speculative]
        return cls(chosen, chosen_s, other, other_s, spec[0] if len(spec) == 1 else None)

    @property
    def faster_s(self) -> float:
        return min(self.chosen_s, self.other_s)

    def sides(self) -> dict[str, float]:
        """The seconds of the SIDES this pair has (see SIDES)."""
        out = {"chosen": self.chosen_s, "faster": self.faster_s}
        if self.speculated is not None:
            on_spec = self.speculated == self.chosen
            out["speculative"] = self.chosen_s if on_spec else self.other_s
            out["baseline"] = self.other_s if on_spec else self.chosen_s
        return out


def paired(
    primary: Primary, route: Route, answer: ShadowAnswer, speculative: Container[Route]
) -> PairedTiming | None:
    """The pair's timing (`route`: the copy's), if it is comparable (see the module's
    docstring)."""
    if not primary.alone or answer.completion_tokens != primary.completion_tokens:
        return None
    if not (answer.duration_s > 0 and primary.duration_s > 0):
        return None
    return PairedTiming.of(primary.route, primary.duration_s, route, answer.duration_s, speculative)


class PairSums:
    """Sums of e2e seconds per side over comparable pairs, and the ratios they give:
    the gateway's live figures (PairTotals) and `specroute advise`'s reading of the
    shadow lines both count with it."""

    __slots__ = ("pairs", "seconds")

    def __init__(self) -> None:
        self.pairs = 0
        self.seconds = dict.fromkeys(SIDES, 0.0)

    def add(self, timing: PairedTiming) -> None:
        self.pairs += 1
        for side, seconds in timing.sides().items():
            self.seconds[side] += seconds

    @property
    def speedup(self) -> float | None:
        """Baseline e2e / speculative e2e; None before the first pair."""
        spec = self.seconds["speculative"]
        return self.seconds["baseline"] / spec if spec else None

    @property
    def regret(self) -> float | None:
        """The chosen route's e2e / the faster one's; None before the first pair."""
        faster = self.seconds["faster"]
        return self.seconds["chosen"] / faster if faster else None


class PairTotals:
    """Per workload and over all, the sums behind the live speedup and regret, and
    their metrics."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._by: dict[str, PairSums] = defaultdict(PairSums)
        self._all = PairSums()
        for w in Workload:
            metrics.shadow_speedup.labels(w.value).set(math.nan)
            metrics.shadow_regret.labels(w.value).set(math.nan)

    @property
    def pairs(self) -> dict[str, int]:
        """Comparable pairs per workload (only those with one)."""
        return {workload: sums.pairs for workload, sums in self._by.items()}

    def add(self, workload: str, timing: PairedTiming) -> None:
        sums = self._by[workload]
        sums.add(timing)
        self._all.add(timing)
        for side, seconds in timing.sides().items():
            self._metrics.shadow_seconds.labels(workload, side).inc(seconds)
        self._metrics.shadow_speedup.labels(workload).set(sums.speedup or math.nan)
        self._metrics.shadow_regret.labels(workload).set(sums.regret or math.nan)

    def speedup(self, workload: str) -> float | None:
        sums = self._by.get(workload)
        return sums.speedup if sums else None

    def regret(self, workload: str) -> float | None:
        sums = self._by.get(workload)
        return sums.regret if sums else None

    def overall(self) -> tuple[float | None, int]:
        """The speedup over every workload's pairs, and how many pairs."""
        return self._all.speedup, self._all.pairs


def shadow_lesson(
    primary: Primary, route: Route, state: LiveState, answer: ShadowAnswer
) -> Lesson | None:
    """The shadow's answer as the policy learns from it: its own route, load and
    figures; no prediction (none was made for this load), so no error is scored."""
    if not answer.completion_tokens or answer.completion_tokens <= 0:
        return None
    rate = answer.acceptance.per_step if answer.acceptance else None
    return Lesson(
        route, primary.features, state, answer.ttft_s, answer.duration_s,
        answer.prompt_tokens, answer.completion_tokens, rate, None, primary.pair,
    )  # fmt: skip


def shadow_line(
    primary: Primary,
    route: Route,
    outcome: str,
    answer: ShadowAnswer | None,
    comparable: bool,
    speculative: Container[Route],
) -> dict[str, Any]:
    """The shadow log's line for a shadow that ran: figures only, never text."""
    acceptance = answer.acceptance if answer else None
    return {
        "kind": "shadow",
        "ts": round(time.time(), 3),
        "request_id": primary.request_id,
        "workload": primary.features.workload.value,
        "features": dataclasses.asdict(primary.features),
        "pair": primary.pair,
        "primary_route": primary.route.value,
        "primary_reason": primary.reason,
        "shadow_route": route.value,
        # Which of the two speculates (for the speedup): its name, or null (both, neither).
        "speculated": next((r.value for r in (primary.route, route) if r in speculative), None)
        if (primary.route in speculative) != (route in speculative)
        else None,
        "outcome": outcome,
        "comparable": comparable,
        "primary_s": rounded(primary.duration_s),
        "shadow_s": rounded(answer.duration_s) if answer else None,
        "shadow_ttft_s": rounded(answer.ttft_s) if answer else None,
        "primary_completion_tokens": primary.completion_tokens,
        "shadow_completion_tokens": answer.completion_tokens if answer else None,
        "acceptance": rounded(acceptance.rate) if acceptance else None,
        "acceptance_source": acceptance.source if acceptance else None,
    }
