"""A slow drift of each route's decode time against its profile, from its own answers."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from classifier.cost import Prediction
from classifier.types import FinishedRequest, Route

# Drift learns only from answers of at least this many decode steps (a few steps' time
# is mostly the first token's), each answer's ratio clamped to [1/x, x]: a choice, so
# one answer held up by a stalled server moves the drift by at most log(4) / weight.
_DRIFT_MIN_STEPS = 4.0
_DRIFT_CLAMP = 4.0


@dataclass(slots=True)
class _RouteDrift:
    """Running mean of log(measured / profiled decode time) over one route's own answers
    (the last drift_memory of them), and how many it has had."""

    own: float = 0.0
    count: int = 0
    beyond: int = 0  # answers in a row whose own ratio was past the contradiction bound


class Drift:
    """Per route of the profile in use (restart), its drift.

    memory: the answers the running mean follows (drift_memory); a drift beyond `ratio`
    (contradiction_ratio) over `after` (contradiction_after) answers contradicts the
    profile, which counts as `after` answers of no drift."""

    __slots__ = ("_after", "_memory", "_ratio", "_routes")

    def __init__(self, memory: float, ratio: float, after: int) -> None:
        self._memory, self._ratio, self._after = memory, ratio, after
        self._routes: dict[Route, _RouteDrift] = {}

    def restart(self, routes: Iterable[Route]) -> None:
        self._routes = {r: _RouteDrift() for r in routes}

    def contradicted(self) -> bool:
        return any(d.beyond >= self._after for d in self._routes.values())

    def factor(self, route: Route) -> float:
        """Measured / profiled decode time (1.0: as profiled)."""
        return math.exp(self.log(route))

    def factors(self) -> dict[Route, float]:
        return {r: self.factor(r) for r in self._routes}

    def learn(self, route: Route, outcome: FinishedRequest, explained: Prediction) -> None:
        """Measured decode time over the profile's, for this answer's length and load.

        Decode against decode: the measured first token off the measured time, the
        predicted one off the prediction (a first token mispredicted, as a prompt far
        past the profile's longest probe is, would otherwise read as a slow decode:
        1.8x on 4k-token prompts in bursts on one emulated GPU)."""
        if explained.decode_steps < _DRIFT_MIN_STEPS:
            return
        ttft = outcome.ttft_s
        if ttft is None:
            ttft = explained.first_token_s
        measured = outcome.duration_s - ttft
        drift = self._routes[route]
        profiled = (explained.e2e_s - explained.first_token_s) / math.exp(self.log(route))
        if measured <= 0 or profiled <= 0:
            return
        ratio = min(_DRIFT_CLAMP, max(1.0 / _DRIFT_CLAMP, measured / profiled))
        drift.own += (math.log(ratio) - drift.own) / min(drift.count + 1.0, self._memory)
        drift.count += 1
        bound = math.log(self._ratio)
        drift.beyond = drift.beyond + 1 if abs(math.log(ratio)) > bound else 0

    def log(self, route: Route) -> float:
        """The route's drift: its own answers' mean, shrunk toward the other routes' (the
        profile's error on this machine, where this route has not run yet), which are
        shrunk toward the profile (no drift).

        The profile counts as contradiction_after answers (it takes that many past the
        bound to call it wrong): a transient, such as the first answers on a server a
        busy GPU's batch is moving to, one prefill after another, moves it a little;
        alone, the first of those set a 1.5x drift and sent the batch back (one emulated
        GPU, fresh, c=32: benchmarks/one_gpu_scenarios.py). The other routes' drift is
        the prior because what makes a profile wrong is mostly the machine's, not the
        route's: measured at 20 tokens of context with no prefill beside, on the measured
        H200's emulator at c=32 it read eagle3-k3 1.42x slow, and eagle3-k7, never run
        and taken at 1.00x, drew the batch (benchmarks/n_routes.py, seed 5)."""
        trusted = float(self._after)
        others = [d for r, d in self._routes.items() if r != route]
        pooled = sum(d.count * d.own for d in others) / (sum(d.count for d in others) + trusted)
        mine = self._routes[route]
        return (mine.count * mine.own + trusted * pooled) / (mine.count + trusted)
