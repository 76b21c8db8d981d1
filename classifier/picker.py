"""The picker: the cheapest candidate by the scorer's cost (classifier/cost.py), or,
with the caller's rng, a Thompson draw of acceptance within the regret bound; the rule
that picked, and the reason it gives (a metric label of low cardinality, whatever the
number of routes: the route is another label)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from classifier.filters import Candidates
from classifier.types import LiveState, Route

PROFILED_REASONS = (
    "kv-pressure",
    "spec-busy",
    "spec-predicted-faster",
    "baseline-predicted-faster",
    "consolidate",
    "latency-target",
    "explore",
    "unprofiled",
    "unhealthy-fallback",
)
_FASTER = {True: "spec-predicted-faster", False: "baseline-predicted-faster"}
_REASONS = {
    "unhealthy": "unhealthy-fallback",
    "followers": "consolidate",
    "targets": "latency-target",
    "thompson-draw": "explore",
}


@dataclass(frozen=True, slots=True)
class Pick:
    route: Route
    rule: str  # guard, unhealthy, targets, followers, smaller-cost or thompson-draw

    @property
    def explorable(self) -> bool:
        """A cost decided it, so a draw of acceptance may change it."""
        return self.rule in ("smaller-cost", "followers")

    def reason(self, left: Candidates, *, profiled: bool) -> str:
        if self.rule == "guard":
            return next(iter(left.spared.values()))
        if not profiled and self.rule != "unhealthy":
            return "unprofiled"
        if self.rule == "smaller-cost":
            return _FASTER[self.route in left.speculative]
        return _REASONS[self.rule]


def cheapest(
    left: Candidates,
    cost: Mapping[Route, float],
    alone: Mapping[Route, float],
    state: LiveState,
    aimed: Sequence[Route] = (),
) -> Pick:
    """The cheapest choice by `cost` (of `aimed`, those the latency targets leave, if
    any: classifier/targets.py); its rule: the guards', the cheapest allowed route
    unhealthy, the targets (the cheapest choice missed them), the followers (the
    cheapest by `alone`, without them, differs) or cost."""
    route = min(aimed or left.choice, key=cost.__getitem__)
    if left.guarded:
        return Pick(route, "guard")
    if not state.of(min(left.allowed, key=cost.__getitem__)).healthy:
        return Pick(route, "unhealthy")
    if route != min(left.choice, key=cost.__getitem__):
        return Pick(route, "targets")
    if route != min(left.choice, key=alone.__getitem__):
        return Pick(route, "followers")
    return Pick(route, "smaller-cost")


def thompson(
    best: Pick,
    choice: Sequence[Route],
    cost: Mapping[Route, float],
    drawn: Mapping[Route, float],
    max_regret: float,
) -> Pick:
    """The cheapest by the `drawn` cost, where its mean cost is within max_regret of the
    best's: the worst a user pays for exploration."""
    pick = min(choice, key=drawn.__getitem__)
    limit = (1.0 + max_regret) * cost[best.route]
    if pick != best.route and cost[pick] <= limit:
        return Pick(pick, "thompson-draw")
    return best
