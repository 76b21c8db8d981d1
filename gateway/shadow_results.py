"""What a finished shadow copy leaves behind: its pair's figures, a lesson, a log line.

A pair (a user request and its shadow) is the same request on both routes. It
measures the speedup (baseline e2e / speculative e2e) and the regret of the
choice (the chosen route's e2e / the faster one's) only when it is comparable:
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from classifier.features import Workload
from classifier.policy import LiveState, Route
from gateway.outcome import rounded
from gateway.record import Lesson
from gateway.shadow_copy import Primary, ShadowAnswer
from gateway.telemetry import Metrics

SIDES = ("speculative", "baseline", "chosen", "faster")


def shadow_log_path(outcome_log: Path) -> Path:
    """Where the shadows' lines go beside an outcome log (and a rotated one's)."""
    name = outcome_log.name
    if ".jsonl" in name:
        return outcome_log.with_name(name.replace(".jsonl", ".shadows.jsonl", 1))
    return outcome_log.with_name(name + ".shadows")


@dataclass(frozen=True, slots=True)
class PairedTiming:
    """One comparable pair's e2e on each route, and which the gateway chose."""

    speculative_s: float
    baseline_s: float
    chosen: Route

    @property
    def chosen_s(self) -> float:
        return self.speculative_s if self.chosen is Route.SPECULATIVE else self.baseline_s

    @property
    def faster_s(self) -> float:
        return min(self.speculative_s, self.baseline_s)


def paired(primary: Primary, answer: ShadowAnswer) -> PairedTiming | None:
    """The pair's timing, if it is comparable (see the module's docstring)."""
    if not primary.alone or answer.completion_tokens != primary.completion_tokens:
        return None
    if not (answer.duration_s > 0 and primary.duration_s > 0):
        return None
    if primary.route is Route.SPECULATIVE:
        return PairedTiming(primary.duration_s, answer.duration_s, primary.route)
    return PairedTiming(answer.duration_s, primary.duration_s, primary.route)


class PairTotals:
    """Per workload, the sums over comparable pairs behind the live speedup and regret."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._sums: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(SIDES, 0.0))
        self.pairs: dict[str, int] = defaultdict(int)
        for w in Workload:
            metrics.shadow_speedup.labels(w.value).set(math.nan)
            metrics.shadow_regret.labels(w.value).set(math.nan)

    def add(self, workload: str, timing: PairedTiming) -> None:
        sums = self._sums[workload]
        self.pairs[workload] += 1
        for side, seconds in zip(
            SIDES,
            (timing.speculative_s, timing.baseline_s, timing.chosen_s, timing.faster_s),
            strict=True,
        ):
            sums[side] += seconds
            self._metrics.shadow_seconds.labels(workload, side).inc(seconds)
        self._metrics.shadow_speedup.labels(workload).set(self.speedup(workload) or math.nan)
        self._metrics.shadow_regret.labels(workload).set(self.regret(workload) or math.nan)

    def speedup(self, workload: str) -> float | None:
        sums = self._sums.get(workload)
        return sums["baseline"] / sums["speculative"] if sums and sums["speculative"] else None

    def overall(self) -> tuple[float | None, int]:
        """The speedup over every workload's pairs, and how many pairs."""
        spec = sum(s["speculative"] for s in self._sums.values())
        base = sum(s["baseline"] for s in self._sums.values())
        return (base / spec if spec else None), sum(self.pairs.values())

    def regret(self, workload: str) -> float | None:
        sums = self._sums.get(workload)
        return sums["chosen"] / sums["faster"] if sums and sums["faster"] else None


def shadow_lesson(
    primary: Primary, route: Route, state: LiveState, answer: ShadowAnswer
) -> Lesson | None:
    """The shadow's answer as the policy learns from it: its own route, load and
    figures; no prediction (none was made for this load), so no error is scored."""
    if not answer.completion_tokens or answer.completion_tokens <= 0:
        return None
    rate = answer.acceptance.rate if answer.acceptance else None
    return Lesson(
        route, primary.features, state, answer.ttft_s, answer.duration_s,
        answer.prompt_tokens, answer.completion_tokens, rate, None, primary.pair,
    )  # fmt: skip


def shadow_line(
    primary: Primary, route: Route, outcome: str, answer: ShadowAnswer | None, comparable: bool
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
