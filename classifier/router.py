"""ProfiledPolicy: the engine's costs from a profile, acceptance from the traffic, one rule.

What belongs to the machine is measured once (classifier/profile.py: time to
first token per prompt length, the step per batch size, how much a neighbour's
step slows one's own); what belongs to the traffic is learned online: the
acceptance per workload, as a posterior with its uncertainty, the answers'
lengths, each route's failures, and a slow drift of each route's decode time
against its profile. One route's costs are never guessed from another's.

    e2e_r = queue_r + ttft_r(prompt + prefill ahead)
          + (n_out - 1) / tau_r * step_r(b_r + n) * drift_r * slowdown_r
    tau   = 1 + k * rho       (1 without speculation)
    slowdown_r = 1 + (busy neighbours on r's device) * (beside_r - 1)

beside_r is the profile's measured ratio of r's step beside a busy neighbour to its
step alone: about 2 on one GPU, whose two vLLM processes are time-sliced (an H200:
1.86-2.17, whatever the neighbour's step), about 1 with a GPU each.

rho is accepted drafts per decode step over k, every step counted: not vLLM's
accepted / drafted, which counts only the steps that drafted. vLLM's n-gram
drafter proposes nothing where the text has no match; on the real CPU pair a
chat answer drafted on 2 of 61 steps at a rate of 0.38, 1.05 tokens a step
where 1 + k * 0.38 says 2.5 (gateway/wire/acceptance.py).

One cost model at every load, in stages (the Inference Extension's scheduler):
filters (the guards, kv-pressure and spec-busy, then health), one scorer, a picker.
A route's cost is what sending the request there adds to the time of every
request in the system:

    cost_r = e2e_r                  its own time, its neighbours' slicing included
           + grown_r + sliced_r     the steps it adds to r's batch, and the time its
                                    device's busy neighbours lose to r's steps
           + fail_r * retry_r       a failed answer is answered again elsewhere
           + followers_r            on a time-sliced device: the requests that arrive
                                    before the device next empties join the server
                                    it starts (e^L - 1 of them at load L), each
                                    paying the mix's time there over the cheapest
                                    carrier's (_followers)

An idle neighbour costs nothing to share with; a busy one makes a split cost its
batch; at light load almost nobody follows, so each request goes where it is
fastest, and at moderate load the followers decide where the batch lives
("consolidate" when they changed the route). The picker takes the cheapest, or
with the caller's rng a Thompson draw of rho from its posterior ("explore" when
the draw changed the route), never onto a route whose cost is more than
explore_max_regret above the best.

decide() reads and never writes: the same inputs and rng state give the same
decision, /decide calls it without copying anything, and without an rng it is
the posterior mean's decision. learn() is the only writer. Every decision
carries `why`: both predictions, the acceptance used, the rule that decided,
for the request's log line, its headers and /decide.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from classifier.acceptance_model import AcceptanceModel
from classifier.features import RequestFeatures, Workload
from classifier.guards import DEFAULT_GUARDS, GuardsConfig
from classifier.output_length import OutputLengthModel
from classifier.profile import Curve, EngineProfile, RouteProfile, ServerIdentity
from classifier.speculation import acceptance_rate, alpha_from_rate
from classifier.traffic import Traffic
from classifier.types import (
    TWO_ROUTES,
    BackendState,
    Decision,
    FinishedRequest,
    LiveState,
    Route,
    RouteSpec,
)

__all__ = [
    "PROFILED_REASONS",
    "AcceptanceBelief",
    "PredictionErrors",
    "ProfiledPolicy",
    "RouterConfig",
    "prior_profile",
]

PROFILED_REASONS = (
    "kv-pressure",
    "spec-busy",
    "spec-predicted-faster",
    "baseline-predicted-faster",
    "consolidate",
    "explore",
    "unprofiled",
    "unhealthy-fallback",
)
# The reason a cost decision names, by whether the cheaper route speculates (a label of
# low cardinality whatever the number of routes; the route itself is another label).
_FASTER = {True: "spec-predicted-faster", False: "baseline-predicted-faster"}
# A speculative answer shorter than this many tokens per sequence measures its
# acceptance coarsely (a few steps' worth) and counts proportionally less.
_FULL_WEIGHT_TOKENS = 32.0
# An in-flight request started at a uniformly random earlier time has, on
# average, half a life of the same length left: the share of a new request's
# decode that overlaps each request in flight, for what it adds to them.
_OVERLAP_SHARE = 0.5
# The traffic's workload shares follow the last ~1000 answers, and the followers' horizon
# is at most that many requests. Over 100 answers a kind's share has a sampling sd of
# about 5 points, enough to flip the carrier of a mix whose two carriers are within 10%
# (benchmarks/open_loop.py, 1B draft, moderate load, seed 2: 1.107x the better static
# route at 100, 1.019x at 1000, the rest unchanged); bursts of one kind are followed by
# the traffic's stickiness, not by its memory (benchmarks/one_gpu_scenarios.py: the
# same figures at both).
_TRAFFIC_MEMORY = 1000.0
# A workload no probe measured: acceptance rate 0.5 worth one request, the middle of
# [0, 1] at the least weight that still gives the posterior a mean.
_NEUTRAL_RATE, _NEUTRAL_WEIGHT = 0.5, 1.0
# The finer acceptance key's temperature buckets (greedy, low, moderate, high): upper
# bounds of the first three. 1.0 is where the target samples its own distribution
# (vLLM's default); 0.05 counts near-greedy settings as greedy.
_TEMPERATURE_BUCKETS = (0.05, 0.5, 1.0)
# The floor on a belief's between-request variance (rate units squared: a 0.01 sd), a
# choice: a run of identical rates would otherwise claim certainty and stop exploring.
_VARIANCE_FLOOR = 1e-4
# The prior_sd's weight, in requests, as a prior on the spread of single answers around
# their key's mean: half a request, so a second answer already speaks mostly for itself
# (on the measured H200's emulator that spread is 0.02-0.11, against prior_sd's 0.2).
_SPREAD_PRIOR_WEIGHT = 0.5
# The probes' bias against the traffic (ProfiledPolicy._learn_probe_bias): the configured
# prior_sd / sqrt(probe_weight) counts as one probed key's evidence, and a key counts once
# it has two answers' weight, the least that measures their spread around their mean.
_BIAS_PRIOR_KEYS = 1.0
_BIAS_MIN_ANSWERS = 2.0
# Drift learns only from answers of at least this many decode steps (a few steps' time
# is mostly the first token's), each answer's ratio clamped to [1/x, x]: a choice, so
# one answer held up by a stalled server moves the drift by at most log(4) / weight.
_DRIFT_MIN_STEPS = 4.0
_DRIFT_CLAMP = 4.0
# A route's failure rate per workload starts from one success: no route is written off
# by its first failure.
_FAILURE_PRIOR_SUCCESSES = 1.0
# The built-in prior (prior_profile): the talk's 8B target on the measured H200
# (tooling/emulator/gpu/measured): first token 15 ms + 0.03 ms per prompt token (119 ms
# at 4k measured), a step 6 ms + 0.05 ms per sequence (6.06 ms at batch 1, 7.61 at 32).
_PRIOR_TTFT_S, _PRIOR_TTFT_PER_TOKEN_S = 0.015, 0.00003
_PRIOR_STEP_S, _PRIOR_STEP_PER_SEQ_S = 0.006, 0.00005
_PRIOR_BESIDE = 2.0  # one time-sliced GPU, as deploy/gpu runs the pair


@dataclass(frozen=True, slots=True)
class RouterConfig:
    # A Thompson draw may send a request to a route whose mean cost is at most this
    # much above the best: the worst a user pays for exploration (a product bound,
    # not tuned: 25% of one request, on a few requests per new workload).
    explore_max_regret: float = 0.25
    # Weight of a profile probe's acceptance, in requests (the profile runs about
    # two probes per workload kind), and the spread of a request's acceptance
    # around its workload's mean before any is measured (in units of rho): the mean's
    # uncertainty before its first answer is prior_sd / sqrt(probe_weight) = 0.14, the
    # real engine's probes against its traffic (benchmarks/real_routes.py prints their
    # RMS: 0.137 on the CPU trio, 2026-12-05; docs/routes.md). The emulator's probes are
    # exact but for chat, so there this explores more than it needs to.
    probe_weight: float = 2.0
    prior_sd: float = 0.2
    # Memories, in requests: acceptance and failures follow a changed draft or
    # traffic; drift corrects the profile slowly; a drift beyond
    # contradiction_ratio over contradiction_after answers says "profile again".
    acceptance_memory: float = 1000.0
    drift_memory: float = 100.0
    failure_memory: float = 50.0
    contradiction_ratio: float = 1.5
    contradiction_after: int = 20
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.explore_max_regret >= 0:
            raise ValueError("router: need explore_max_regret >= 0")
        if not (self.probe_weight > 0 and 0 < self.prior_sd <= 0.5):
            raise ValueError("router: need probe_weight > 0 and 0 < prior_sd <= 0.5")
        if min(self.acceptance_memory, self.drift_memory, self.failure_memory) < 1:
            raise ValueError("router: memories must be >= 1 request")
        if self.contradiction_ratio <= 1 or self.contradiction_after < 1:
            raise ValueError("router: need contradiction_ratio > 1, contradiction_after >= 1")


# ---- what is learned -------------------------------------------------------------------


@dataclass(slots=True)
class AcceptanceBelief:
    """Posterior of one key's mean acceptance rho (accepted drafts per step / k).

    Decayed sums of the requests' rates (weight, weighted sum, weighted sum of
    squares) and a prior: the mean at prior_mean, as sure as prior_n requests of
    spread prior_sd (its sd prior_sd / sqrt(prior_n)). Normal on normal: the
    answers' mean counts by its precision, their weight over their own spread
    around their own mean (prior_sd a prior on that spread worth half a request),
    so answers that agree soon outweigh a probe that missed them. Drawn from for
    Thompson sampling and clipped into [0, 1].
    """

    prior_mean: float
    prior_n: float
    prior_sd: float
    n: float = 0.0
    total: float = 0.0
    squares: float = 0.0

    def observe(self, rate: float, weight: float, decay: float) -> None:
        self.n = self.n * decay + weight
        self.total = self.total * decay + weight * rate
        self.squares = self.squares * decay + weight * rate * rate

    @property
    def weight(self) -> float:
        return self.n + self.prior_n

    def answers(self) -> tuple[float, float]:
        """The answers' own mean rate and their variance around it (n > 0)."""
        mean = self.total / self.n
        return mean, max(self.squares / self.n - mean * mean, 0.0)

    def _precisions(self) -> tuple[float, float]:
        """The prior's precision and the answers' (1 / variance of the mean)."""
        prior = self.prior_n / max(self.prior_sd**2, _VARIANCE_FLOOR)
        if self.n <= 0:
            return prior, 0.0
        own = self.n * self.answers()[1]
        spread = (own + _SPREAD_PRIOR_WEIGHT * self.prior_sd**2) / (self.n + _SPREAD_PRIOR_WEIGHT)
        return prior, self.n / max(spread, _VARIANCE_FLOOR)

    @property
    def mean(self) -> float:
        prior, answers = self._precisions()
        if answers <= 0:
            return self.prior_mean
        return (prior * self.prior_mean + answers * self.answers()[0]) / (prior + answers)

    @property
    def sd(self) -> float:
        """The uncertainty of the mean (not the spread of single requests)."""
        return 1.0 / math.sqrt(sum(self._precisions()))

    def sample(self, rng: random.Random) -> float:
        return min(1.0, max(0.0, rng.gauss(self.mean, self.sd)))

    def to_json(self) -> list[float]:
        return [self.prior_mean, self.prior_n, self.prior_sd, self.n, self.total, self.squares]


@dataclass(slots=True)
class PredictionErrors:
    """Sums of |predicted - measured| / measured over one route's answers.

    as_sent: the prediction the decision was made with. given_length: the model
    asked again with the answer's true length and acceptance: the profile's own
    error, without the error of guessing the length.
    """

    count: int = 0
    as_sent: float = 0.0
    given_length: float = 0.0

    def since(self, earlier: PredictionErrors | None) -> PredictionErrors:
        earlier = earlier or PredictionErrors()
        return PredictionErrors(
            self.count - earlier.count,
            self.as_sent - earlier.as_sent,
            self.given_length - earlier.given_length,
        )

    def mape(self) -> tuple[float, float]:
        if self.count <= 0:
            return math.nan, math.nan
        return self.as_sent / self.count, self.given_length / self.count


@dataclass(slots=True)
class _Drift:
    """Running mean of log(measured / profiled decode time) over one route's own answers
    (the last drift_memory of them), and how many it has had."""

    own: float = 0.0
    count: int = 0
    beyond: int = 0  # answers in a row whose own ratio was past the contradiction bound


@dataclass(frozen=True, slots=True)
class _Prediction:
    e2e_s: float
    cost_s: float
    tokens_per_step: float
    decode_steps: float
    first_token_s: float  # of e2e_s: the queue and the first token


# ---- the built-in prior, before any profile --------------------------------------------


def prior_profile(routes: Sequence[RouteSpec] = TWO_ROUTES) -> EngineProfile:
    """What the router assumes before the profile is in, labelled "prior" so every
    decision made on it says "unprofiled": the talk's 8B target on the measured H200
    (the _PRIOR_* figures), each speculative step x (1 + k*c), one shared GPU."""
    batches = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
    base_step = tuple(_PRIOR_STEP_S + _PRIOR_STEP_PER_SEQ_S * b for b in batches)
    longest = 4096.0

    def route(spec: RouteSpec) -> RouteProfile:
        factor = 1.0 + spec.k * spec.draft_cost_ratio
        return RouteProfile(
            name=spec.name.value,
            identity=ServerIdentity("", "", "unknown", spec.method, spec.k),
            ttft=Curve(
                (1.0, longest),
                tuple(_PRIOR_TTFT_S + _PRIOR_TTFT_PER_TOKEN_S * n for n in (1.0, longest)),
            ),
            step=Curve(batches, tuple(s * factor for s in base_step)),
            beside=_PRIOR_BESIDE,
        )

    return EngineProfile(
        routes=tuple(route(spec) for spec in routes),
        created="",
        took_s=0.0,
        source="prior",
    )


# ---- the policy ------------------------------------------------------------------------


class ProfiledPolicy:
    """Predicted-latency routing on a measured engine profile; see the module docstring."""

    __slots__ = (
        "_beliefs",
        "_config",
        "_decay",
        "_drift",
        "_errors",
        "_failures",
        "_guards",
        "_model",
        "_outputs",
        "_prior",
        "_probe_bias",
        "_profile",
        "_routes",
        "_spread",
        "_traffic",
    )

    def __init__(
        self,
        config: RouterConfig,
        *,
        routes: Sequence[RouteSpec] = TWO_ROUTES,
        profile: EngineProfile | None = None,
        guards: GuardsConfig = DEFAULT_GUARDS,
        model: AcceptanceModel | None = None,
    ) -> None:
        names = [r.name for r in routes]
        if len(routes) < 2 or len(set(names)) != len(names):
            raise ValueError(f"router: want two or more routes of distinct names, got {names}")
        self._config = config
        self._guards = guards
        self._routes = {r.name: r for r in routes}
        self._model = model
        self._prior = prior_profile(routes)
        self._profile: EngineProfile | None = None
        # Per route, workload and temperature bucket (-1: the workload's): one route's
        # acceptance is never another's (a different drafter or k accepts differently).
        self._beliefs: dict[tuple[Route, Workload, int], AcceptanceBelief] = {}
        self._outputs = OutputLengthModel()
        self._traffic = Traffic(_TRAFFIC_MEMORY)
        self._drift = {r: _Drift() for r in _routes(self._prior)}
        self._failures: dict[tuple[Route, Workload], list[float]] = {}
        self._errors: dict[Route, PredictionErrors] = {}
        self._decay = 1.0 - 1.0 / config.acceptance_memory
        self._probe_bias = config.prior_sd / math.sqrt(config.probe_weight)
        self._spread = config.prior_sd
        if profile is not None:
            self.use_profile(profile)

    # ---- the profile ------------------------------------------------------------------

    @property
    def config(self) -> RouterConfig:
        return self._config

    @property
    def profile(self) -> EngineProfile | None:
        """The measured profile in use (None: not in yet; decisions say "unprofiled")."""
        return self._profile

    @property
    def wants_profile(self) -> bool:
        """Its costs come from the engine profile: the gateway measures one for it."""
        return True

    def use_profile(self, profile: EngineProfile) -> None:
        """Take a new profile: its probes' acceptance becomes each workload's prior (what
        traffic has taught stays, on top), and the drift starts over against it."""
        missing = [r.value for r in self._routes if profile.route(r.value) is None]
        if missing:
            raise ValueError(f"router: the profile does not measure route(s) {missing}")
        # The configured routes only, in the configuration's order (a profile may
        # measure a route the gateway no longer runs).
        self._profile = replace(profile, routes=tuple(_route(profile, r) for r in self._routes))
        for (route, workload, _), belief in self._beliefs.items():
            self._set_prior(belief, route, workload)
        self._learn_probe_bias()
        self._drift = {r: _Drift() for r in _routes(self._profile)}

    def profile_contradicted(self) -> bool:
        """Live decode times have disagreed with the profile beyond the bound for
        contradiction_after answers in a row on some route: profile again."""
        return any(d.beyond >= self._config.contradiction_after for d in self._drift.values())

    def _active(self) -> EngineProfile:
        return self._profile or self._prior

    def _set_prior(self, belief: AcceptanceBelief, route: Route, workload: Workload) -> None:
        measured = _route(self._active(), route)
        probe = measured.tokens_per_step.get(workload)
        k = measured.identity.num_speculative_tokens
        if probe is not None and k > 0:
            belief.prior_mean = min(1.0, max(0.0, (probe[0] - 1.0) / k))
            belief.prior_n, belief.prior_sd = self._probe_weight(), self._spread
        else:  # no probe of this kind: a neutral guess worth one request
            belief.prior_mean, belief.prior_n = _NEUTRAL_RATE, _NEUTRAL_WEIGHT
            belief.prior_sd = self._config.prior_sd

    def _probe_weight(self) -> float:
        """A probe's worth, in requests of the learned spread: as sure as the probes'
        learned bias allows (its sd is the bias)."""
        return (self._spread / self._probe_bias) ** 2

    def _probed(self, route: Route, workload: Workload) -> bool:
        measured = _route(self._active(), route)
        return measured.speculative and workload in measured.tokens_per_step

    def _learn_probe_bias(self) -> None:
        """How far the profile's probes sit from the traffic, learned across keys.

        The probed prior's uncertainty is this bias: each probed workload with answers
        measures it once, (answers' mean - probe)^2 less the answers' own sampling
        variance (an unbiased estimate of bias^2); the configured prior_sd /
        sqrt(probe_weight) counts as one key. A key not yet answered explores as much
        as the probes of the answered keys were wrong: on the measured H200's emulator
        they are within 0.014 but for chat, on real vLLM 0.137 RMS (docs/routes.md).
        """
        sd = self._config.prior_sd
        squares, keys = _BIAS_PRIOR_KEYS * sd**2 / self._config.probe_weight, _BIAS_PRIOR_KEYS
        spreads, answers = _SPREAD_PRIOR_WEIGHT * sd**2, _SPREAD_PRIOR_WEIGHT
        for (route, workload, level), b in self._beliefs.items():
            if level >= 0 or b.n < _BIAS_MIN_ANSWERS or not self._probed(route, workload):
                continue
            mean, spread = b.answers()
            spread = max(spread, _VARIANCE_FLOOR)
            squares += (mean - b.prior_mean) ** 2 - spread / b.n
            keys += 1
            spreads += b.n * spread
            answers += b.n
        self._probe_bias = math.sqrt(max(squares / keys, _VARIANCE_FLOOR))
        self._spread = math.sqrt(spreads / answers)
        for (route, workload, _), b in self._beliefs.items():
            if self._probed(route, workload):
                b.prior_n, b.prior_sd = self._probe_weight(), self._spread

    # ---- deciding (reads only) ---------------------------------------------------------

    def decide(
        self,
        features: RequestFeatures,
        state: LiveState,
        pair: int = 0,
        rng: random.Random | None = None,
    ) -> Decision:
        """The route within `pair`; with `rng`, acceptance drawn from its posterior."""
        profile = self._active()
        routes = _routes(profile)
        rho = {r: self._rate(r, features) for r in routes}
        predicted = {r: self._predict(profile, features, state, r, rho[r]) for r in routes}
        speculating = [r for r in routes if _route(profile, r).speculative]
        why: dict[str, Any] = {
            "profile": profile.source,
            "acceptance": {r.value: round(rho[r], 4) for r in speculating},
            "acceptance_sd": {
                r.value: round(self._belief_for(r, features).sd, 4) for r in speculating
            },
            "probe_bias_sd": round(self._probe_bias, 4),
        }
        priced = profile.source != "prior"
        lightest = min((state.of(r).load for r in routes if r not in speculating), default=None)
        guards = {
            r: reason
            for r in speculating
            if (
                reason := self._guards.reason(
                    state.of(r), batch_priced=priced, lightest_other=lightest
                )
            )
            is not None
        }
        allowed = [r for r in routes if r not in guards] or list(routes)
        healthy = [r for r in allowed if state.of(r).healthy] or [
            r for r in routes if state.of(r).healthy
        ]
        lead = self._followers(profile, features, state, predicted)
        cost = {r: predicted[r].cost_s + lead.get(r, 0.0) for r in routes}
        choice = healthy or allowed
        route = min(choice, key=cost.__getitem__)
        if guards and not any(r in choice for r in speculating):
            reason, rule = next(iter(guards.values())), "guard"
        elif not state.of(min(allowed, key=cost.__getitem__)).healthy:
            reason, rule = "unhealthy-fallback", "unhealthy"
        elif route != min(choice, key=lambda r: predicted[r].cost_s):
            reason, rule = "consolidate", "followers"
        else:
            reason, rule = _FASTER[route in speculating], "smaller-cost"
        if rng is not None and rule in ("smaller-cost", "followers") and len(choice) > 1:
            drawn = {r: self._belief_for(r, features).sample(rng) for r in speculating}
            sampled = {
                r: self._predict(profile, features, state, r, drawn.get(r, 0.0)).cost_s
                + lead.get(r, 0.0)
                for r in choice
            }
            pick = min(choice, key=sampled.__getitem__)
            limit = (1.0 + self._config.explore_max_regret) * cost[route]
            why["acceptance_drawn"] = {r.value: round(v, 4) for r, v in drawn.items()}
            if pick != route and cost[pick] <= limit:
                route, reason, rule = pick, "explore", "thompson-draw"
        if profile.source == "prior" and rule != "guard":
            reason = "unprofiled"
        why["rule"] = rule
        if guards:
            why["spared"] = {r.value: g for r, g in guards.items()}
        why["cost_s"] = {r.value: round(p.cost_s, 6) for r, p in predicted.items()}
        if lead:
            why["followers_s"] = {r.value: round(v, 6) for r, v in lead.items()}
        why["tokens_per_step"] = {
            r.value: round(predicted[r].tokens_per_step, 3) for r in speculating
        }
        return Decision(route, reason, {r: p.e2e_s for r, p in predicted.items()}, why)

    def predict(self, f: RequestFeatures, state: LiveState, pair: int = 0) -> dict[Route, float]:
        """Predicted seconds, send to last byte, on each route (the posterior mean)."""
        profile = self._active()
        return {
            r: self._predict(profile, f, state, r, self._rate(r, f)).e2e_s for r in _routes(profile)
        }

    def _predict(
        self,
        profile: EngineProfile,
        f: RequestFeatures,
        state: LiveState,
        route: Route,
        rho: float,
        output_tokens: float | None = None,
    ) -> _Prediction:
        here, me = state.of(route), _route(profile, route)
        others = [(r, state.of(r), _route(profile, r)) for r in _routes(profile) if r != route]
        tau = self._tau(me, rho)
        n = max(f.n, 1)
        out = self._outputs.predict(f) if output_tokens is None else output_tokens
        steps = max(out - 1.0, 0.0) / tau
        batch = here.load
        drift = math.exp(self._log_drift(route))
        # Time-sliced: while a neighbour on its device is busy, each step takes its share.
        near = profile.neighbours(route.value)
        busy = [(s, o) for r, s, o in others if s.load > 0 and r.value in near]
        slowdown = me.slowdown(len(busy))
        step = me.step.at(batch + n) * drift * slowdown
        ttft = me.ttft.at(f.prompt_tokens + here.prefill_tokens)
        # While it decodes, the requests in flight there end and others like them arrive
        # (a closed loop replaces each about once a life): their prompts' prefill chunks
        # lengthen the steps it is in.
        prefills = 0.0
        # Only on a measured first-token curve: the prior's is a guess, and this term
        # multiplies it by the batch (on the prior, a chaos run at c=32 priced a busy
        # server seconds dearer than it was and split the batch: a probe waited 6x).
        if batch > 0 and profile.source != "prior":
            likely = self._traffic.coming(dict(here.mix))
            arrivals = batch * min(1.0, out / self._traffic.mean_output(likely))
            prefills = arrivals * _prefill_of(me, self._traffic.mean_prompt(likely)) * slowdown
        alone = ttft + steps * step + prefills
        queue = (here.waiting or 0) / max(here.running or 0, 1) * alone
        e2e = queue + alone
        # What it adds to the requests in flight: each step of its server grows by
        # the larger batch; and while it decodes, each busy neighbour's requests run
        # at 1/beside of their speed. An idle server starts that for this request's
        # whole decode; a busy one already slows them and extends it by about half.
        grown = batch * (step - me.step.at(batch) * drift * slowdown) if batch > 0 else 0.0
        extends = 1.0 if batch == 0 else 1.0 - _OVERLAP_SHARE
        slowed = sum(s.load * (1.0 - 1.0 / o.slowdown(1)) for s, o in busy) * extends
        added = _OVERLAP_SHARE * steps * (grown + slowed * step)
        fail = self._failure_rate(route, f.workload)
        retry = 0.0
        if fail > 0 and others:  # a failed answer costs its time, then one elsewhere
            retry = min(
                o.ttft.at(f.prompt_tokens)
                + max(out - 1, 0) / self._tau(o, self._rate(r, f)) * o.step.at(s.load + n)
                for r, s, o in others
            )
        return _Prediction(e2e, e2e + added + fail * retry, tau, steps, queue + ttft)

    def _followers(
        self,
        profile: EngineProfile,
        f: RequestFeatures,
        state: LiveState,
        predicted: Mapping[Route, _Prediction],
    ) -> dict[Route, float]:
        """What the requests that follow this one pay for where it leads them, over the
        cheapest carrier of its device (s, 0 for that carrier; none off a shared device).

        On a time-sliced device a request that starts a server's batch leads the next
        arrivals there: splitting off costs each of them its neighbours' slowdown, so
        they join it until the device next empties. With load L in flight (Poisson
        arrivals, many servers' worth of batch: M/G/inf), a batch serves e^L requests
        before the device empties, so e^L - 1 follow, at most the traffic's memory (the
        mix is not known further ahead). Each pays the mix's time on the route it is
        led to (its learned kinds and lengths, this request's where none is known yet)
        over the cheapest route's. At L=0.6 under one follows; at L=5 the mix's carrier
        decides, which is what consolidation was."""
        out: dict[Route, float] = {}
        for group in profile.devices():
            members = [r for r in predicted if r.value in group]
            if len(members) < 2 or not profile.shared(group):
                continue
            here = sum(state.of(r).load for r in members)
            load = max(self._traffic.expected_load() - 1.0, float(here))
            follow = min(math.expm1(load), _TRAFFIC_MEMORY)
            if follow <= 0:
                continue
            mix: dict[Workload, float] = {f.workload: float(max(f.n, 1))}
            for r in members:
                for workload, count in state.of(r).mix:
                    mix[workload] = mix.get(workload, 0.0) + count
            coming = self._traffic.coming(mix) or mix
            prompt = self._traffic.mean_prompt(coming) or float(f.prompt_tokens)
            output = self._traffic.mean_output(coming)
            if self._traffic.seen <= 0:
                output = max(output, self._outputs.predict(f))
            batch = max(round(load) + 1, 1)
            life = {
                r: _route(profile, r).ttft.at(prompt)
                + self._carry(profile, r, coming, batch, 0.0) * max(output - 1.0, 0.0)
                for r in members
            }
            best = min(life.values())
            out.update({r: follow * (life[r] - best) for r in members})
        return out

    def _carry(
        self,
        profile: EngineProfile,
        route: Route,
        mix: Mapping[Workload, float],
        total: int,
        sds: float,
    ) -> float:
        """Seconds per token of each sequence with `route` carrying the whole batch alone,
        the prefill of the prompts that arrive meanwhile included on a measured profile
        (one per request per life); each workload's acceptance `sds` posterior sds above
        its mean."""
        rp = _route(profile, route)
        step = rp.step.at(total) * math.exp(self._log_drift(route))
        # Weighed by the tokens each workload generates: a sequence's decode lasts its
        # tokens / tau steps, so a long answer's acceptance counts for its length.
        weights = self._traffic.output_weights(mix)
        per_token = 0.0
        for workload, weight in weights.items():
            belief = self._workload_belief(route, workload)
            rho = min(1.0, max(0.0, belief.mean + sds * belief.sd))
            per_token += weight / self._tau(rp, rho)
        decode = step * per_token / sum(weights.values())
        if profile.source == "prior":  # its first-token curve is a guess, as in _predict
            return decode
        prompt, output = self._traffic.mean_prompt(mix), self._traffic.mean_output(mix)
        return decode + total * _prefill_of(rp, prompt) / output

    def _tau(self, route: RouteProfile, rho: float) -> float:
        """Tokens one step yields there: 1 + k * rho speculative (its own k), 1 without."""
        return 1.0 + route.identity.num_speculative_tokens * rho

    # ---- acceptance --------------------------------------------------------------------

    def _key(self, route: Route, f: RequestFeatures) -> tuple[Route, Workload, int]:
        """The finer key: the route, workload and sampling temperature (greedy, low,
        moderate, high): acceptance falls with temperature within a workload."""
        bucket = sum(1 for bound in _TEMPERATURE_BUCKETS if f.temperature > bound)
        return route, f.workload, bucket

    def _belief_for(self, route: Route, f: RequestFeatures) -> AcceptanceBelief:
        """The finer key's belief if it has any data, else the workload's; a workload
        not measured yet takes the offline model's prediction for this very request
        (`specroute train` on the outcome log) as its prior mean, where one is given."""
        fine = self._beliefs.get(self._key(route, f))
        if fine is not None and fine.n > 0:
            return fine
        belief = self._workload_belief(route, f.workload)
        k = _route(self._active(), route).identity.num_speculative_tokens
        if self._model is None or belief.n > 0 or k <= 0:
            return belief
        rate = acceptance_rate(self._model.predict(f), k)
        return AcceptanceBelief(rate, self._config.probe_weight, self._config.prior_sd)

    def _workload_belief(self, route: Route, workload: Workload) -> AcceptanceBelief:
        known = self._beliefs.get((route, workload, -1))
        if known is not None:
            return known
        fresh = AcceptanceBelief(_NEUTRAL_RATE, _NEUTRAL_WEIGHT, self._config.prior_sd)
        self._set_prior(fresh, route, workload)
        return fresh

    def _rate(self, route: Route, f: RequestFeatures) -> float:
        return self._belief_for(route, f).mean

    def _failure_rate(self, route: Route, workload: Workload) -> float:
        counts = self._failures.get((route, workload))
        if counts is None:
            return 0.0
        failed, seen = counts
        return failed / (seen + _FAILURE_PRIOR_SUCCESSES)

    # ---- learning (the only writer) ----------------------------------------------------

    def learn(self, outcome: FinishedRequest) -> None:
        """One finished, successful answer, at the load its decision saw."""
        if outcome.completion_tokens <= 0:
            return
        if not (math.isfinite(outcome.duration_s) and outcome.duration_s > 0):
            return
        f, route = outcome.features, outcome.route
        if route not in self._routes:  # a route this policy was not configured with
            return
        per_seq = outcome.completion_tokens / max(f.n, 1)
        rho = self._rate(route, f)
        speculative = _route(self._active(), route).speculative
        acceptance = outcome.acceptance
        if speculative and acceptance is not None and math.isfinite(acceptance):
            rho = min(1.0, max(0.0, acceptance))
            if per_seq >= 2:
                weight = min(1.0, per_seq / _FULL_WEIGHT_TOKENS)
                for key in ((route, f.workload, -1), self._key(route, f)):
                    belief = self._beliefs.get(key)
                    if belief is None:
                        belief = self._beliefs[key] = self._workload_belief(route, f.workload)
                        if key[2] >= 0:  # the finer key starts from its workload's mean
                            belief = self._beliefs[key] = AcceptanceBelief(
                                belief.mean, belief.prior_n, belief.prior_sd
                            )
                    belief.observe(rho, weight, self._decay)
                self._learn_probe_bias()
        self._outputs.observe(f, outcome.completion_tokens)
        load = sum(s.load for s in outcome.state.servers.values()) + max(f.n, 1)
        self._traffic.observe(f.workload, f.prompt_tokens, per_seq, load)
        self._count_failure(route, f.workload, failed=False)
        profile = self._active()
        explained = self._predict(profile, f, outcome.state, route, rho, output_tokens=per_seq)
        if outcome.predicted_s is not None and math.isfinite(outcome.predicted_s):
            errors = self._errors.setdefault(route, PredictionErrors())
            errors.count += 1
            errors.as_sent += abs(outcome.predicted_s - outcome.duration_s) / outcome.duration_s
            errors.given_length += abs(explained.e2e_s - outcome.duration_s) / outcome.duration_s
        self._learn_drift(profile, route, f, outcome, explained)

    def _learn_drift(
        self,
        profile: EngineProfile,
        route: Route,
        f: RequestFeatures,
        outcome: FinishedRequest,
        explained: _Prediction,
    ) -> None:
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
        drift = self._drift[route]
        profiled = (explained.e2e_s - explained.first_token_s) / math.exp(self._log_drift(route))
        if measured <= 0 or profiled <= 0:
            return
        ratio = min(_DRIFT_CLAMP, max(1.0 / _DRIFT_CLAMP, measured / profiled))
        drift.own += (math.log(ratio) - drift.own) / min(
            drift.count + 1.0, self._config.drift_memory
        )
        drift.count += 1
        bound = math.log(self._config.contradiction_ratio)
        drift.beyond = drift.beyond + 1 if abs(math.log(ratio)) > bound else 0

    def _log_drift(self, route: Route) -> float:
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
        trusted = float(self._config.contradiction_after)
        others = [d for r, d in self._drift.items() if r != route]
        pooled = sum(d.count * d.own for d in others) / (sum(d.count for d in others) + trusted)
        mine = self._drift[route]
        return (mine.count * mine.own + trusted * pooled) / (mine.count + trusted)

    def learn_failure(self, route: Route, features: RequestFeatures) -> None:
        """An answer the route failed (an error status or a stream that broke)."""
        self._count_failure(route, features.workload, failed=True)

    def _count_failure(self, route: Route, workload: Workload, *, failed: bool) -> None:
        decay = 1.0 - 1.0 / self._config.failure_memory
        counts = self._failures.setdefault((route, workload), [0.0, 0.0])
        counts[0] = counts[0] * decay + float(failed)
        counts[1] = counts[1] * decay + 1.0

    def learn_shadow(self, outcome: FinishedRequest) -> None:
        """A shadow copy's answer: the same posteriors, observed at no user's expense."""
        self.learn(outcome)

    # ---- read-back ---------------------------------------------------------------------

    def estimated_acceptance(self) -> dict[Route, dict[Workload, float]]:
        """Per-position acceptance a per speculative route and workload (the unit of the
        gauges), from the posterior mean rate; only workloads with a profile probe or a
        measurement on that route."""
        out: dict[Route, dict[Workload, float]] = {}
        profile = self._active()
        for route in _routes(profile):
            measured = _route(profile, route)
            k = measured.identity.num_speculative_tokens
            if k <= 0:
                continue
            believed: dict[Workload, float] = {}
            for workload in Workload:
                if (route, workload, -1) in self._beliefs or workload in measured.tokens_per_step:
                    rate = self._workload_belief(route, workload).mean
                    believed[workload] = alpha_from_rate(rate, k)
            out[route] = believed
        return out

    def acceptance_beliefs(self) -> dict[Route, dict[Workload, tuple[float, float, float]]]:
        """(mean rate, its sd, measured weight) per speculative route and workload seen
        or probed."""
        out: dict[Route, dict[Workload, tuple[float, float, float]]] = {}
        for route, believed in self.estimated_acceptance().items():
            out[route] = {}
            for workload in believed:
                b = self._workload_belief(route, workload)
                out[route][workload] = (b.mean, b.sd, b.n)
        return out

    def probe_misses(self) -> dict[Route, dict[Workload, tuple[float, float, float]]]:
        """(probe's rate, answers' mean rate, their weight) per speculative route and
        probed workload with answers: what the probes' learned bias is made of."""
        out: dict[Route, dict[Workload, tuple[float, float, float]]] = {}
        for (route, workload, level), b in self._beliefs.items():
            if level < 0 and b.n > 0 and self._probed(route, workload):
                out.setdefault(route, {})[workload] = (b.prior_mean, b.answers()[0], b.n)
        return out

    @property
    def probe_bias(self) -> float:
        """The probes' learned bias against the traffic (rate units, an sd)."""
        return self._probe_bias

    def shared_gpu(self, pair: int = 0) -> bool | None:
        if self._profile is None:
            return None
        return self._profile.shared_gpu

    def drift(self) -> dict[Route, float]:
        """Measured / profiled decode time per route (1.0: as profiled)."""
        return {r: math.exp(self._log_drift(r)) for r in self._drift}

    def error_totals(self) -> dict[Route, PredictionErrors]:
        return {r: e.since(None) for r, e in self._errors.items()}

    # ---- state that survives a restart -------------------------------------------------

    def state_to_json(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "routes": {r.value: spec.k for r, spec in self._routes.items()},
            "acceptance": {
                f"{r.value}/{w.value}/{b}": belief.to_json()
                for (r, w, b), belief in self._beliefs.items()
            },
            "outputs": self._outputs.to_json(),
            "failures": {f"{r.value}/{w.value}": c for (r, w), c in self._failures.items()},
            "traffic": self._traffic.to_json(),
        }

    def load_state(self, raw: object) -> None:
        """What an earlier process learned. Anything but a state of this format whose
        routes have the k they have now, every figure a finite number >= 0 that the
        sums read back sanely, is refused (ValueError) whole: nothing of it is taken.
        A route the state names and the configuration no longer has is dropped. The
        two-route format (/1: one speculative route's k) is read as the route
        "speculative"."""
        if not isinstance(raw, Mapping):
            raise ValueError("router state: want a JSON object")
        ks = {r.value: spec.k for r, spec in self._routes.items()}
        acceptance = _table(raw, "acceptance")
        if raw.get("format") == _TWO_ROUTE_STATE_FORMAT:
            mine = ks.get(Route.SPECULATIVE.value)
            if raw.get("k") != mine:
                raise ValueError(f"router state: a two-route state with k={raw.get('k')}")
            acceptance = {f"{Route.SPECULATIVE.value}/{k}": v for k, v in acceptance.items()}
        elif raw.get("format") == STATE_FORMAT:
            theirs = _table(raw, "routes")
            changed = [n for n, k in theirs.items() if n in ks and ks[n] != k]
            if changed:
                raise ValueError(f"router state: route(s) {changed} had another k")
        else:
            raise ValueError(f"router state: want format {STATE_FORMAT!r}")
        beliefs: dict[tuple[Route, Workload, int], AcceptanceBelief] = {}
        for key, values in acceptance.items():
            name, workload, fine = _parts(key, 3, "acceptance")
            belief = AcceptanceBelief(*_figures(values, 6, f"acceptance {key!r}"))
            if not (belief.prior_mean <= 1 and belief.weight > 0):
                raise ValueError(f"router state: acceptance {key!r}: want a mean in [0, 1]")
            if not (math.isfinite(belief.mean) and math.isfinite(belief.sd)):
                raise ValueError(f"router state: acceptance {key!r}: sums out of range")
            if name in ks:
                beliefs[(Route(name), Workload(workload), int(fine))] = belief
        failures: dict[tuple[Route, Workload], list[float]] = {}
        for key, values in _table(raw, "failures").items():
            r, w = _parts(key, 2, "failures")
            failed, seen = _figures(values, 2, f"failures {key!r}")
            if failed > seen:
                raise ValueError(f"router state: failures {key!r}: more failed than seen")
            if r in ks:
                failures[(Route(r), Workload(w))] = [failed, seen]
        outputs = OutputLengthModel.from_json(
            {k: _figures(v, 2, f"outputs {k!r}") for k, v in _table(raw, "outputs").items()}
        )
        traffic = Traffic(_TRAFFIC_MEMORY)
        traffic.load_json(raw.get("traffic", {}))
        self._beliefs, self._failures, self._outputs = beliefs, failures, outputs
        self._traffic = traffic
        if self._profile is not None:
            for (route, workload, level), belief in beliefs.items():
                if level < 0:
                    self._set_prior(belief, route, workload)
            self._learn_probe_bias()


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


STATE_FORMAT = "specroute.router-state/2"
_TWO_ROUTE_STATE_FORMAT = "specroute.router-state/1"  # before routes had names


def _route(profile: EngineProfile, route: Route) -> RouteProfile:
    found = profile.route(route.value)
    if found is None:  # use_profile checked both are there
        raise KeyError(route.value)
    return found


def _routes(profile: EngineProfile) -> tuple[Route, ...]:
    """The profile's routes in its order: the decision takes the cheapest of a list,
    so another speculative configuration is one more entry."""
    return tuple(Route(r.name) for r in profile.routes)


def _prefill_of(route: RouteProfile, prompt_tokens: float) -> float:
    """What one prompt's prefill adds to a busy server's steps: its first-token time
    over an empty prompt's (on a measured H200, a 512-token chunk in a batch-8 step
    added 10.9 ms where the prefill table grows 10.4 ms)."""
    if prompt_tokens <= 0:
        return 0.0
    return max(route.ttft.at(prompt_tokens) - route.ttft.at(1.0), 0.0)


def _grown(spec: BackendState, load: int) -> BackendState:
    """The speculative server as it would be carrying the whole batch."""
    return BackendState(
        inflight=load,
        healthy=spec.healthy,
        kv_cache_usage=spec.kv_cache_usage,
        others=0,
    )
