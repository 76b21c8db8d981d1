"""What the router learned, as JSON, kept over a restart: each drafter's acceptance
(per-position a, whatever a route's k), the answers' lengths, failures per route and
the traffic's mix."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from classifier.beliefs import AcceptanceBelief, BeliefKey
from classifier.cost import TRAFFIC_MEMORY
from classifier.features import Workload
from classifier.output_length import OutputLengthModel
from classifier.traffic import Traffic
from classifier.types import Route

# /3: acceptance per drafter in a. /2 held it per route in rho at that route's k, and
# /1 per the one speculative route: sums of rho do not convert to sums of a, so an
# older state is refused (logged) and learned again.
STATE_FORMAT = "specroute.router-state/3"


@dataclass(frozen=True, slots=True)
class LearnedState:
    """What survives a restart, as the policy holds it."""

    beliefs: dict[BeliefKey, AcceptanceBelief]
    failures: dict[tuple[Route, Workload], list[float]]
    outputs: OutputLengthModel
    traffic: Traffic


def dump_state(learned: LearnedState) -> dict[str, Any]:
    """The state's JSON."""
    return {
        "format": STATE_FORMAT,
        "acceptance": {
            f"{d}/{w.value}/{b}": belief.to_json() for (d, w, b), belief in learned.beliefs.items()
        },
        "outputs": learned.outputs.to_json(),
        "failures": {f"{r.value}/{w.value}": c for (r, w), c in learned.failures.items()},
        "traffic": learned.traffic.to_json(),
    }


def parse_state(raw: object, routes: Collection[str], drafters: Collection[str]) -> LearnedState:
    """What an earlier process learned. Anything but a state of this format, every
    figure a finite number >= 0 that the sums read back sanely, is refused (ValueError)
    whole: nothing of it is taken. A route or drafter the state names and the
    configuration no longer has is dropped."""
    if not isinstance(raw, Mapping):
        raise ValueError("router state: want a JSON object")
    if raw.get("format") != STATE_FORMAT:
        raise ValueError(
            f"router state: want format {STATE_FORMAT!r} (an older one held acceptance per"
            " route, not per drafter: it is learned again)"
        )
    beliefs: dict[BeliefKey, AcceptanceBelief] = {}
    for key, values in _table(raw, "acceptance").items():
        drafter, workload, fine = _parts(key, 3, "acceptance")
        belief = AcceptanceBelief(*_figures(values, 6, f"acceptance {key!r}"))
        if not (belief.prior_mean <= 1 and belief.weight > 0):
            raise ValueError(f"router state: acceptance {key!r}: want a mean in [0, 1]")
        if not (math.isfinite(belief.mean) and math.isfinite(belief.sd)):
            raise ValueError(f"router state: acceptance {key!r}: sums out of range")
        if drafter in drafters:
            beliefs[(drafter, Workload(workload), int(fine))] = belief
    failures: dict[tuple[Route, Workload], list[float]] = {}
    for key, values in _table(raw, "failures").items():
        r, w = _parts(key, 2, "failures")
        failed, seen = _figures(values, 2, f"failures {key!r}")
        if failed > seen:
            raise ValueError(f"router state: failures {key!r}: more failed than seen")
        if r in routes:
            failures[(Route(r), Workload(w))] = [failed, seen]
    outputs = OutputLengthModel.from_json(
        {k: _figures(v, 2, f"outputs {k!r}") for k, v in _table(raw, "outputs").items()}
    )
    traffic = Traffic(TRAFFIC_MEMORY)
    traffic.load_json(raw.get("traffic", {}))
    return LearnedState(beliefs, failures, outputs, traffic)


def _parts(key: str, count: int, what: str) -> list[str]:
    """A state key's `/`-separated parts, `count` of them."""
    parts = key.split("/")
    if len(parts) != count:
        raise ValueError(f"router state: {what} {key!r}: want {count} parts")
    return parts


def _table(raw: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A state's table (absent: empty)."""
    table = raw.get(name, {})
    if not isinstance(table, Mapping):
        raise ValueError(f"router state: {name}: want a JSON object")
    return table


def _figures(values: object, count: int, what: str) -> list[float]:
    """`count` finite numbers >= 0, as a state writes them."""
    if not (
        isinstance(values, list)
        and len(values) == count
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    ):
        raise ValueError(f"router state: {what}: want {count} numbers")
    try:
        figures = [float(v) for v in values]
    except OverflowError:
        raise ValueError(f"router state: {what}: a number out of range") from None
    if not all(math.isfinite(v) and v >= 0 for v in figures):
        raise ValueError(f"router state: {what}: want finite numbers >= 0")
    return figures
