"""Per-route latency model, fitted online from what the backends actually did.

    e2e = queue + prefill + decode
        = q * waiting + (t0 + p * prompt_tokens) + steps * (s0 + s1 * batch)
    steps = (output_tokens - 1) / tokens_per_step

The first token comes out of prefill; every later one needs a decode step
whose cost grows with the batch it shares. A baseline step yields one token;
a speculative step runs the draft k times and verifies, so it costs more but
yields tokens_per_step(a, k) tokens. Each route has its own five rates.

The rates start from config priors (the speculative step's prior pays the
draft: x (1 + k*c)) and are fitted by exponentially weighted least squares
with a fixed ridge toward the priors. The fit is on multipliers of the priors
and on latencies divided by the prior's prediction, so every request counts by
its relative error (a 30 s request does not drown out a 0.3 s one) and the
ridge means "prior_weight requests' worth of belief" whatever the units. The
ridge never decays, so a rate the traffic never exercises (say, queueing when
nothing ever waits) stays at its prior instead of drifting; the data decays,
so the fit follows a backend that changes. Residuals beyond 4x their running
scale are clipped and multipliers stay within [1/max_factor, max_factor], so
one stalled request cannot wreck the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from classifier.policy import Route

__all__ = ["LatencyModel", "LatencyParameters", "LatencyPriors", "RouteFit", "RouteLoad"]

_N = 5  # t0, p, s0, s1, q
# A route's own fit counts with weight min(1, recent / _BORROW_WEIGHT); the
# rest is the other route's fitted scale. `recent` fades by _FADE for each
# observation of the other route (half-life ~70 observations), so a route with
# steady traffic stands on its own fit and a starved one leans on the other.
_BORROW_WEIGHT = 20.0
_FADE = 0.99


@dataclass(frozen=True, slots=True)
class LatencyPriors:
    """Starting rates of the baseline engine (config); the fit moves from here."""

    ttft_base_s: float = 0.02  # fixed time to the first token (scheduling, first step)
    prefill_s_per_token: float = 0.0002
    step_base_s: float = 0.010  # one decode step of a batch of one
    step_per_seq_s: float = 0.0005  # what each further sequence in the batch adds to a step
    queue_s_per_waiting: float = 0.1  # extra wait per request already queued on the backend
    # The speculative step's rates; None: the baseline's x (1 + k*c), Leviathan's
    # memory-bound step. Its verify pass computes k + 1 tokens per sequence, so
    # under load the real per-sequence cost is higher: set it if you know it
    # (the fit finds it either way).
    spec_step_base_s: float | None = None
    spec_step_per_seq_s: float | None = None
    prior_weight: float = 2.0  # requests' worth of belief in each prior rate (a light pull)
    memory: float = 2000.0  # requests: the fit's effective window (older ones fade)
    max_factor: float = 20.0  # fitted rates stay within [prior / f, prior * f]

    def __post_init__(self) -> None:
        rates = (
            self.ttft_base_s,
            self.prefill_s_per_token,
            self.step_base_s,
            self.step_per_seq_s,
            self.queue_s_per_waiting,
            *(r for r in (self.spec_step_base_s, self.spec_step_per_seq_s) if r is not None),
        )
        if not all(math.isfinite(r) and r > 0 for r in rates):
            raise ValueError("latency priors: every rate must be a finite number > 0")
        if not (self.prior_weight > 0 and self.memory >= 1 and self.max_factor > 1):
            raise ValueError("latency priors: need prior_weight > 0, memory >= 1, max_factor > 1")


@dataclass(frozen=True, slots=True)
class RouteLoad:
    """What one request meets on one route: the inputs of a prediction, and of a fit."""

    prompt_tokens: float
    output_tokens: float
    batch: float  # requests on that server once this one joins (incl. itself)
    waiting: float = 0.0  # requests queued there
    tokens_per_step: float = 1.0  # 1 on the baseline
    # The other server's batch when both share one GPU (0 if they do not, or it
    # is idle): each of this request's steps also waits for one step there.
    other_batch: float = 0.0
    # Prompt tokens still being prefilled there when it is sent: its own
    # prefill waits for them, at the same rate per token.
    prefill_ahead: float = 0.0

    @property
    def steps(self) -> float:
        """Decode steps after the first token (which comes out of prefill)."""
        return max(self.output_tokens - 1.0, 0.0) / max(self.tokens_per_step, 1.0)

    @property
    def prefill(self) -> float:
        """Prompt tokens prefilled before its first token: its own and those ahead."""
        return self.prompt_tokens + max(self.prefill_ahead, 0.0)


@dataclass(frozen=True, slots=True)
class LatencyParameters:
    """One route's current rates, for metrics and logs."""

    ttft_base_s: float
    prefill_s_per_token: float
    step_base_s: float
    step_per_seq_s: float
    queue_s_per_waiting: float
    samples: float  # effective (decayed) number of fitted rows


class RouteFit:
    """Online ridge-to-prior fit of one route's five rates."""

    __slots__ = (
        "_a",
        "_anchor",
        "_b",
        "_clip_scale",
        "_decay",
        "_max",
        "_min",
        "_prior",
        "_ridge",
        "_solved",
        "rates",
        "recent",
        "samples",
    )

    def __init__(self, prior: tuple[float, ...], priors: LatencyPriors) -> None:
        self._prior = np.array(prior, dtype=float)
        self._ridge = priors.prior_weight
        self._decay = 1.0 - 1.0 / priors.memory
        self._min, self._max = 1.0 / priors.max_factor, priors.max_factor
        self._a = np.zeros((_N, _N))
        self._b = np.zeros(_N)
        self._clip_scale = 0.15  # running mean |relative residual|
        self.samples = 0.0  # effective (decayed) number of rows fitted
        # Plain floats: the decision path reads these, and numpy scalars are slow.
        self.rates: tuple[float, ...] = tuple(float(v) for v in prior)
        self._solved = self.rates  # this route's own fit, before any borrowing
        # The other route's multipliers when this one was last fitted (None: never).
        self._anchor: tuple[float, ...] | None = None
        # Own observations, fading as the other route is observed instead: a
        # route the policy stopped choosing gradually leans on the other again.
        self.recent = 0.0

    def predict(self, prompt_tokens: float, steps: float, batch: float, waiting: float) -> float:
        t0, p, s0, s1, q = self.rates
        return t0 + p * prompt_tokens + steps * (s0 + s1 * batch) + q * waiting

    def multipliers(self) -> tuple[float, ...]:
        """This route's own fitted rates as multiples of its priors."""
        return tuple(r / float(p) for r, p in zip(self._solved, self._prior, strict=True))

    def borrow(self, other: RouteFit, weight: float) -> None:
        """Lean on the other route's fit while this one has seen little traffic.

        Both routes run the same model on the same hardware, so what moved the
        observed route since this one was last measured most likely moved this
        one too: a starved route keeps its own measured rates, times the other
        route's drift since then (never measured: its prior, times the other's
        multipliers). Keeping the measured ratio between the routes matters:
        without it a route the policy stopped choosing drifts back to prior x
        the other's multipliers, and the prior's ratio of a speculative to a
        plain step is a guess (Leviathan's 1 + k*c leaves out the verify
        compute and the sampler), so the comparison would be between a fitted
        number and that guess.
        """
        own = self.own_share(weight)
        if own >= 1.0:
            self.rates = self._solved
            return
        theirs = other.multipliers()
        if self._anchor is None:
            borrowed = tuple(float(p) * t for p, t in zip(self._prior, theirs, strict=True))
        else:
            borrowed = tuple(
                r * t / a for r, t, a in zip(self._solved, theirs, self._anchor, strict=True)
            )
        self.rates = tuple(
            own * r + (1.0 - own) * b for r, b in zip(self._solved, borrowed, strict=True)
        )

    def own_share(self, weight: float) -> float:
        """How far this route's rates are its own fit (0..1): recent / weight, at most 1;
        the rest is borrowed from the other route's (borrow)."""
        return min(1.0, self.recent / weight)

    def anchor(self, other: RouteFit) -> None:
        """Remember the other route's state: this route's rates were just measured."""
        self._anchor = other.multipliers()

    def add(self, x: tuple[float, ...], y: float) -> None:
        """Fit one row: y seconds were spent on the cost terms x (same order as the rates)."""
        xv = np.array(x, dtype=float)
        terms = xv * self._prior
        scale = float(terms.sum())  # the prior's prediction: the unit of this row
        if not (math.isfinite(y) and y > 0 and scale > 0):
            return
        z = terms / scale
        target = y / scale
        current = float(z @ (np.array(self.rates) / self._prior))
        relative = target / current - 1.0
        limit = max(4.0 * self._clip_scale, 0.25)
        relative = min(max(relative, -limit), limit)
        self._clip_scale = 0.95 * self._clip_scale + 0.05 * abs(relative)
        target = current * (1.0 + relative)
        self._a *= self._decay
        self._b *= self._decay
        self._a += np.outer(z, z)
        self._b += z * target
        self.samples = self.samples * self._decay + 1.0
        self.recent += 1.0
        ridge = self._ridge * np.eye(_N)
        multipliers = np.linalg.solve(self._a + ridge, self._b + self._ridge)
        multipliers = np.clip(multipliers, self._min, self._max)
        self.rates = self._solved = tuple(float(v) for v in multipliers * self._prior)

    def parameters(self) -> LatencyParameters:
        t0, p, s0, s1, q = self.rates
        return LatencyParameters(t0, p, s0, s1, q, self.samples)


class LatencyModel:
    """Predicted end-to-end latency per route, and the online fit behind it."""

    __slots__ = ("_fits",)

    def __init__(self, priors: LatencyPriors, num_speculative_tokens: int, draft_cost_ratio: float):
        draft = 1.0 + max(num_speculative_tokens, 0) * max(draft_cost_ratio, 0.0)
        base = (
            priors.ttft_base_s,
            priors.prefill_s_per_token,
            priors.step_base_s,
            priors.step_per_seq_s,
            priors.queue_s_per_waiting,
        )
        spec = (
            base[0],
            base[1],
            priors.spec_step_base_s or base[2] * draft,
            priors.spec_step_per_seq_s or base[3] * draft,
            base[4],
        )
        self._fits = {
            Route.BASELINE: RouteFit(base, priors),
            Route.SPECULATIVE: RouteFit(spec, priors),
        }

    def predict(self, route: Route, load: RouteLoad) -> float:
        """Seconds from send to last byte."""
        steps = load.steps
        own = self._fits[route].predict(load.prefill, steps, load.batch, load.waiting)
        return own + steps * self._step(route.other, load.other_batch)

    def slowdown_of_others(self, route: Route, load: RouteLoad) -> float:
        """Seconds this request adds to everyone else's answers, summed.

        Each of its steps adds one sequence to its server's batch (s1 for each
        request already there) and, on a shared GPU, makes the other server's
        requests wait for that step too, the whole step if this server was idle.
        Routing on a request's own latency alone ignores this, and at load it
        wakes an idle server whose every step then slows the busy one.
        """
        _, _, s0, s1, _ = self._fits[route].rates
        own = max(load.batch - 1.0, 0.0)  # the requests already on this server
        added = own * s1
        if load.other_batch > 0:
            added += load.other_batch * (s1 if own > 0 else s0 + s1)
        return load.steps * added

    def _step(self, route: Route, batch: float) -> float:
        """One decode step of `route` at `batch` (0 when idle)."""
        if batch <= 0:
            return 0.0
        _, _, s0, s1, _ = self._fits[route].rates
        return s0 + s1 * batch

    def observe(
        self, route: Route, load: RouteLoad, *, duration_s: float, ttft_s: float | None
    ) -> None:
        """Learn from one finished request.

        With a TTFT (streamed) the request gives two rows, prefill and decode,
        which pin the two parts down separately; without one it gives one row
        for the total. Both feed the same fit. The other server's steps it
        waited for (shared GPU, see predict) are taken out first, at that
        route's current rates, so each route fits its own cost.
        """
        fit = self._fits[route]
        steps, batch, waiting = load.steps, load.batch, load.waiting
        waited = steps * self._step(route.other, load.other_batch)
        if ttft_s is not None and 0 < ttft_s <= duration_s:
            fit.add((1.0, load.prefill, 0.0, 0.0, waiting), ttft_s)
            decode = duration_s - ttft_s
            if steps > 0:
                fit.add((0.0, 0.0, steps, steps * batch, 0.0), max(decode - waited, 0.1 * decode))
        else:
            own = max(duration_s - waited, 0.1 * duration_s)
            fit.add((1.0, load.prefill, steps, steps * batch, waiting), own)
        other = self._fits[route.other]
        fit.anchor(other)
        other.recent *= _FADE
        for thin, rich in ((fit, other), (other, fit)):
            thin.borrow(rich, _BORROW_WEIGHT)

    def parameters(self) -> dict[Route, LatencyParameters]:
        return {route: fit.parameters() for route, fit in self._fits.items()}

    def own_share(self, route: Route) -> float:
        """How far the route's predictions rest on its own measurements (0..1); the
        rest is borrowed from the other route's fit (RouteFit.borrow)."""
        return self._fits[route].own_share(_BORROW_WEIGHT)
