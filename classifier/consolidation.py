"""Which ONE server should carry the load while both share a busy GPU.

Two vLLM servers on one GPU take turns on it: while both have requests, each
step of one waits for a step of the other, and every round reads the weights
twice. Two half batches therefore cost far more than one full batch, so once
the GPU is busy, sending each request to the route that would suit it alone
(structured to speculative, creative to baseline) makes everyone slower than
either static route. Under load the choice that matters is which server
carries the whole batch.

That choice is measured, not predicted: at a given load the two candidates
differ by a few per cent to a few tens of per cent, and the latency model's
fit (one step cost per batch size, prefills of the neighbours folded in) is
not that precise at a batch it has seen only on one route. So per route and
per load (loads within a factor of sqrt 2 of the same power of two share a
bucket: 6-11 with 8) this keeps the
measured latency per unit of work: sum of e2e over sum of each request's size,
its latency alone on an idle GPU as the model predicts it, so a window that
happened to hold long requests does not count against its route. Only
requests sent while the other server was idle and finished while their route
was still the target count: the others ran beside a split and measure that,
not the route (a topology probe beside the batch is one request, and the
carrier's requests beside it do count: see CostModelPolicy.decide).
Measurements decay, so the first completions after a switch, which are the
short requests, weigh little by the time a trial is judged.

Until the target has been measured at this load, the cost model's prediction
for the whole batch picks the carrier (`lean`). Then a route not measured at
this load for retry_after decisions gets a trial: the target switches to it
for trial_length decisions, after which the smaller measured latency per unit
of work wins, by a margin against flapping and no sooner than `dwell`
decisions after the last switch made on measurements. The target changes only
while the other server is idle (switching while both hold requests is the
split this exists to avoid); the old one then drains.

A host with N GPUs runs a pair per GPU, and each pair has its own target (its
carrier, drain and trials), but the measurements behind them (LoadMeasurements)
are shared: the pairs run the same model on the same class of GPU, like the
latency fit and the acceptance they share. Kept per pair, they accumulated at a
pair's pace while the shared acceptance moved the lean at the host's: over two
emulated pairs at concurrency 8 (tests/gateway/test_pairs.py) a pair's carrier
then followed a lean near zero before its own measurements were enough, and
moved 5 to 12 times in 60-90 decisions in 5 of 12 runs (each move a drain:
both servers busy); shared, each pair's carrier moved twice (a trial and its
verdict) in each of five runs.

Pure and deterministic, like the rest of classifier/.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeGuard

from classifier.policy import Route

__all__ = ["ConsolidationTarget", "LoadMeasurements"]

_DECAY = 0.98  # per measurement of that route at that load: about the last 50 requests
# Single requests' latency per unit of work scatter by tens of per cent (where
# in the batch they land, whose prefill shares their steps); a route is judged
# on at least this many (decayed) requests. A trial yields about that many.
_MIN_SAMPLES = 16.0
_LOAD_SMOOTHING = 0.1  # per decision under load


@dataclass(slots=True)
class _Measured:
    latency_s: float = 0.0  # decayed sums
    size_s: float = 0.0
    count: float = 0.0
    last: int = 0  # decision count at the latest measurement

    def per_unit(self) -> float:
        return self.latency_s / self.size_s


class LoadMeasurements:
    """Measured latency per unit of work, per route and load bucket, with the decision
    clock that dates them. One GPU pair's target owns one; the pairs of a host (the
    same model on the same class of GPU) share one, so that each pair's carrier is
    judged on what all of them measured, as fast as the shared latency fit learns."""

    __slots__ = ("_table", "clock")

    def __init__(self) -> None:
        self._table: dict[tuple[Route, int], _Measured] = {}
        self.clock = 0  # decisions under load, by every target that shares it

    def get(self, route: Route, batch: int) -> _Measured | None:
        return self._table.get((route, _octave(batch)))

    def add(self, route: Route, batch: int, latency_s: float, size_s: float) -> None:
        m = self._table.setdefault((route, _octave(batch)), _Measured())
        m.latency_s = _DECAY * m.latency_s + latency_s
        m.size_s = _DECAY * m.size_s + size_s
        m.count = _DECAY * m.count + 1.0
        m.last = self.clock


class ConsolidationTarget:
    """The route the whole batch goes to while the shared GPU is busy."""

    __slots__ = (
        "_decisions",
        "_draining",
        "_dwell",
        "_hold_until",
        "_load",
        "_margin",
        "_measured",
        "_retry_after",
        "_stray_trial_at",
        "_switched_at",
        "_target",
        "_trial_length",
        "trials",
    )

    def __init__(
        self,
        margin: float = 0.05,
        *,
        retry_after: int = 2000,
        trial_length: int = 64,
        dwell: int = 100,
        initial: Route = Route.BASELINE,
        measurements: LoadMeasurements | None = None,
    ) -> None:
        if not (0.0 <= margin < 1.0 and retry_after >= 1 and trial_length >= 1):
            raise ValueError(
                "consolidation: need 0 <= margin < 1, retry_after >= 1, trial_length >= 1"
            )
        self._margin = margin
        self._retry_after = retry_after
        self._trial_length = trial_length
        self._decisions = 0
        self._hold_until = 0
        self._draining = False
        # After a switch on measurements, the next measurements are of short
        # requests (they finish first) and of the drain: judging on them would
        # flap. Stay at least `dwell` decisions (trials are held by trial_length).
        self._switched_at = -dwell
        self._stray_trial_at = -dwell
        self._dwell = dwell
        self._measured = measurements or LoadMeasurements()
        self._target = initial
        self._load = 0.0  # 0: no decision under load yet
        self.trials = 0

    @property
    def route(self) -> Route:
        return self._target

    @property
    def load(self) -> float:
        """The smoothed load (requests in flight on both) of recent decisions under load."""
        return self._load

    def observed(self, route: Route, batch: int, latency_s: float, size_s: float) -> None:
        """A request sent to `route` into a batch of `batch` (the other server idle) finished.

        size_s: its latency alone on an idle GPU, as predicted (the unit of work).
        """
        if not (latency_s > 0 and size_s > 0 and math.isfinite(latency_s + size_s)):
            return
        self._measured.add(route, batch, latency_s, size_s)

    def per_unit(self, route: Route, batch: int) -> float | None:
        """Measured latency per unit of work on `route` at this load (None: never measured)."""
        m = self._measured.get(route, batch)
        return m.per_unit() if m else None

    def update(
        self,
        inflight: Mapping[Route, int],
        allowed: frozenset[Route],
        lean: Route | None = None,
        *,
        stray_trials: bool = True,
    ) -> Route:
        """Re-choose the target for a request arriving now; call once per decision under load.

        inflight: requests on each route now (not counting this one).
        allowed: the routes that may carry the batch now (a guard can rule one out).
        lean: the server the cost model predicts faster for the batch; followed
        where neither server has been measured enough at this load yet.
        stray_trials: a few measurements that look faster may start a trial. Off
        while the topology is being measured: a trial moves the batch, and the
        probes beside it then measured two GPUs as one (virtual time, concurrency 8).
        """
        self._decisions += 1
        self._measured.clock += 1
        # The bucket the decision is made in follows the smoothed load: a batch
        # dipping for a moment (two answers finishing together) must not start a
        # trial at a load the GPU is not really under.
        now = inflight[Route.SPECULATIVE] + inflight[Route.BASELINE] + 1
        self._load += (_LOAD_SMOOTHING if self._load else 1.0) * (now - self._load)
        batch = round(self._load)
        target, other = self._target, self._target.other
        if target not in allowed:
            if other in allowed:
                self._switch(0)
            return self._target
        if inflight[other] == 0:
            self._draining = False
        elif not self._draining:
            # Load we did not move there (an idle GPU's per-request choice): follow
            # it unless what was measured of that route here, however little, is
            # slower by the margin; else it drains. (Waiting for enough measurements
            # followed a route measured 24% slower on 12 requests for ~35 decisions.)
            follow = other in allowed and not self._looks_slower(other, target, batch, self._margin)
            if inflight[target] == 0 and follow:
                self._target = other
                self._hold_until = 0  # a trial the choice ended is over
            else:
                self._draining = True
            return self._target
        if self._decisions < self._hold_until or self._draining or other not in allowed:
            return self._target
        theirs = self._measured.get(other, batch)
        if theirs is None or self._measured.clock - theirs.last > self._retry_after:
            if not _enough(self._measured.get(target, batch)):
                # Nothing measured to compare a trial with: the prediction decides.
                if lean is other:
                    self._switch(0)
                return self._target
            self._switch(self._trial_length)
            self.trials += 1
            return self._target
        # A few measurements of the other route (a ramp, a lull) start no trial
        # and no lean unless they look faster: treating them as unmeasured (a
        # trial, or the lean, every time) cost 1.09 -> 1.24x the better static
        # route at concurrency 8 in the virtual-time adaptation scenarios (5
        # seeds): trials and lean flips inside short windows split more batches
        # than the stray measurement misled. Ignoring them when they look faster
        # kept k = 8's batch on a server 36% slower (1.36x); a trial then (at
        # most one per dwell, once the topology is known) gave 1.17x there, the
        # worst of the nine one-GPU scenarios 1.36x -> 1.21x, their mean 1.146x
        # -> 1.131x (three of them 2-7% worse: more trials, each a drain).
        if self._decisions - self._switched_at < self._dwell:
            return self._target
        if (
            stray_trials
            and not _enough(theirs)
            and self._looks_slower(target, other, batch, self._margin)
            and self._decisions - self._stray_trial_at >= self._dwell  # not back to back
        ):
            # The other route, seen only a few times here, looked faster: a trial
            # measures it properly (without one, the stray sample blocks every trial
            # for retry_after decisions while the carrier is the slower route).
            self._switch(self._trial_length)
            self._stray_trial_at = self._decisions
            self.trials += 1
            return self._target
        if self._slower(target, other, batch):
            self._switch(0)
            self._switched_at = self._decisions
        return self._target

    def _slower(self, route: Route, than: Route, batch: int) -> bool:
        """Both measured enough at this load, and `route` slower by more than the margin."""
        mine = self._measured.get(route, batch)
        theirs = self._measured.get(than, batch)
        if not (_enough(mine) and _enough(theirs)):
            return False
        return theirs.per_unit() < (1.0 - self._margin) * mine.per_unit()

    def _looks_slower(self, route: Route, than: Route, batch: int, margin: float = 0.0) -> bool:
        """Both measured at this load, however little, and `route` slower on the figures."""
        mine = self._measured.get(route, batch)
        theirs = self._measured.get(than, batch)
        if mine is None or theirs is None:
            return False
        return theirs.per_unit() < (1.0 - margin) * mine.per_unit()

    def _switch(self, hold: int) -> None:
        self._target = self._target.other
        self._hold_until = self._decisions + hold
        self._draining = True  # until the old target is seen idle


def _enough(m: _Measured | None) -> TypeGuard[_Measured]:
    """Measured on enough requests at that load to be compared."""
    return m is not None and m.count >= _MIN_SAMPLES


def _octave(batch: int) -> int:
    """The load bucket: the nearest power of two (1; 2; 3-5; 6-11; 12-22; 23-45; ...)."""
    return round(math.log2(max(batch, 1)))
