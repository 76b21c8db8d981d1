"""ProfiledPolicy: the engine's costs from a profile, acceptance from the traffic, one rule.

What belongs to the machine is measured once (classifier/profile.py); what belongs to
the traffic is learned online: acceptance per drafter and workload, as a posterior
(classifier/beliefs.py), the answers' lengths, each route's failures, and a slow drift
of each route's decode time against its profile (classifier/drift.py). One route's
costs are never guessed from another's. The formulas: docs/decision.md.

decide() is the Inference Extension scheduler's stages: the filters
(classifier/filters.py: guards, health), one scorer (classifier/cost.py: price, the
request's cost to every request in the system, plus its followers') and the picker
(classifier/picker.py: the cheapest, or a Thompson draw within explore_max_regret).
It reads and never writes: the same inputs and rng state give the same decision, and
without an rng it is the posterior mean's. learn() and its siblings are the only
writers; what survives a restart is classifier/persistence.py's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from classifier.acceptance_model import AcceptanceModel
from classifier.beliefs import Acceptance, AcceptanceBelief
from classifier.cost import (
    TRAFFIC_MEMORY,
    Learned,
    followers,
    price,
    prior_profile,
    route_of,
    routes_of,
)
from classifier.drift import Drift
from classifier.features import RequestFeatures, Workload
from classifier.filters import Candidates, candidates
from classifier.guards import DEFAULT_GUARDS, GuardsConfig
from classifier.output_length import OutputLengthModel
from classifier.persistence import LearnedState, dump_state, parse_state
from classifier.picker import PROFILED_REASONS, cheapest, thompson
from classifier.profile import EngineProfile
from classifier.speculation import Schedule, acceptance_rate, alpha_from_rate
from classifier.targets import pick as aim
from classifier.traffic import Traffic
from classifier.types import TWO_ROUTES, Decision, FinishedRequest, LiveState, Route, RouteSpec

__all__ = ["PROFILED_REASONS", "PredictionErrors", "ProfiledPolicy", "RouterConfig"]

# A route's failure rate per workload starts from one success: no route is written off
# by its first failure.
_FAILURE_PRIOR_SUCCESSES = 1.0


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


class ProfiledPolicy:
    """Predicted-latency routing on a measured engine profile; see the module docstring."""

    __slots__ = (
        "_acceptance",
        "_config",
        "_drift",
        "_errors",
        "_failures",
        "_guards",
        "_outputs",
        "_prior",
        "_profile",
        "_routes",
        "_schedules",
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
        # The dynamic-speculation routes' K per batch size (none: every route static).
        self._schedules: dict[Route, Schedule] = {
            r.name: r.k_by_batch for r in routes if r.k_by_batch
        }
        self._prior = prior_profile(routes)
        self._profile: EngineProfile | None = None
        self._acceptance = Acceptance(
            config.prior_sd, config.probe_weight, config.acceptance_memory, model, self._prior
        )
        self._outputs = OutputLengthModel()
        self._traffic = Traffic(TRAFFIC_MEMORY)
        self._drift = Drift(
            config.drift_memory, config.contradiction_ratio, config.contradiction_after
        )
        self._drift.restart(routes_of(self._prior))
        self._failures: dict[tuple[Route, Workload], list[float]] = {}
        self._errors: dict[Route, PredictionErrors] = {}
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
        self._profile = replace(profile, routes=tuple(route_of(profile, r) for r in self._routes))
        self._acceptance.use_profile(self._profile)
        self._drift.restart(routes_of(self._profile))

    def profile_contradicted(self) -> bool:
        """Live decode times have disagreed with the profile beyond the bound for
        contradiction_after answers in a row on some route: profile again."""
        return self._drift.contradicted()

    def _active(self) -> EngineProfile:
        return self._profile or self._prior

    def _learned(self) -> Learned:
        """What the prices read of what was learned (load_state replaces the objects)."""
        acceptance = self._acceptance
        return Learned(
            self._traffic,
            self._outputs,
            self._drift.factor,
            acceptance.rate,
            acceptance.workload_rate,
            self._failure_rate,
        )

    # ---- deciding (reads only) ---------------------------------------------------------

    def decide(
        self, features: RequestFeatures, state: LiveState, rng: random.Random | None = None
    ) -> Decision:
        """The route; with `rng`, acceptance drawn from its posterior."""
        profile, learned = self._active(), self._learned()
        left = candidates(profile, state, self._guards)
        beliefs = self._beliefs(left, features)
        rho = {r: acceptance_rate(b.mean, k) for r, (b, k) in beliefs.items()}
        dynamic = self._schedules
        predicted = {
            r: price(profile, features, state, r, rho.get(r, 0.0), learned, schedules=dynamic)
            for r in left.routes
        }
        lead = followers(profile, features, state, predicted, learned, dynamic)
        cost = {r: predicted[r].cost_s + lead.get(r, 0.0) for r in left.routes}
        regret = self._config.explore_max_regret
        aimed = aim(left.choice, predicted, cost, features.targets, regret)
        alone = {r: p.cost_s for r, p in predicted.items()}
        pick = cheapest(left, cost, alone, state, aimed.allowed)
        drawn: dict[Route, float] | None = None
        if rng is not None and pick.explorable and len(aimed.allowed) > 1:
            drawn = {r: acceptance_rate(b.sample(rng), k) for r, (b, k) in beliefs.items()}
            sampled = {
                r: price(
                    profile, features, state, r, drawn.get(r, 0.0), learned, schedules=dynamic
                ).cost_s
                + lead.get(r, 0.0)
                for r in aimed.allowed
            }
            pick = thompson(pick, aimed.allowed, cost, sampled, regret)
        why: dict[str, Any] = {
            "profile": profile.source,
            "acceptance": _rounded(rho, 4),
            "alpha": _rounded({r: b.mean for r, (b, _) in beliefs.items()}, 4),
            "alpha_sd": _rounded({r: b.sd for r, (b, _) in beliefs.items()}, 4),
            "probe_bias_sd": round(self._acceptance.probe_bias, 4),
        }
        if drawn is not None:
            why["acceptance_drawn"] = _rounded(drawn, 4)
        why["rule"] = pick.rule
        if features.targets is not None:  # llm-d's SLO headers, or the model's default
            why["targets"] = {**features.targets.as_dict(), "met": aimed.met}
        if left.spared:
            why["spared"] = {r.value: g for r, g in left.spared.items()}
        why["cost_s"] = _rounded({r: p.cost_s for r, p in predicted.items()}, 6)
        if lead:
            why["followers_s"] = _rounded(lead, 6)
        tokens = {r: predicted[r].tokens_per_step for r in left.speculative}
        why["tokens_per_step"] = _rounded(tokens, 3)
        if dynamic:  # the K each speculative route proposes at the batch it would join
            why["k"] = {r.value: predicted[r].k for r in left.speculative}
        reason = pick.reason(left, profiled=profile.source != "prior")
        return Decision(pick.route, reason, {r: p.e2e_s for r, p in predicted.items()}, why)

    def _beliefs(
        self, left: Candidates, f: RequestFeatures
    ) -> dict[Route, tuple[AcceptanceBelief, int]]:
        """Each speculative route's belief of the request's acceptance a, and its k."""
        profile = self._active()
        return {
            r: (b, route_of(profile, r).identity.num_speculative_tokens)
            for r in left.speculative
            if (b := self._acceptance.belief_for(r, f)) is not None
        }

    def predict(self, f: RequestFeatures, state: LiveState) -> dict[Route, float]:
        """Predicted seconds, send to last byte, on each route (the posterior mean)."""
        profile, learned = self._active(), self._learned()
        return {
            r: price(
                profile,
                f,
                state,
                r,
                self._acceptance.rate(r, f),
                learned,
                schedules=self._schedules,
            ).e2e_s
            for r in routes_of(profile)
        }

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
        rho = self._acceptance.rate(route, f)
        profile = self._active()
        speculative = route_of(profile, route).speculative
        acceptance = outcome.acceptance
        if speculative and acceptance is not None and math.isfinite(acceptance):
            measured: float | None = min(1.0, max(0.0, acceptance))
            if route in self._schedules:
                measured = self._at_most_k(route, outcome.state, f, min(1.0, max(0.0, acceptance)))
            if measured is not None:  # None: it drafted nothing there
                rho = measured
                self._acceptance.observe(route, f, rho, per_seq)
        self._outputs.observe(f, outcome.completion_tokens)
        load = sum(s.load for s in outcome.state.servers.values()) + max(f.n, 1)
        self._traffic.observe(f.workload, f.prompt_tokens, per_seq, load)
        self._count_failure(route, f.workload, failed=False)
        learned = self._learned()
        explained = price(
            profile,
            f,
            outcome.state,
            route,
            rho,
            learned,
            output_tokens=per_seq,
            schedules=self._schedules,
        )
        if outcome.predicted_s is not None and math.isfinite(outcome.predicted_s):
            errors = self._errors.setdefault(route, PredictionErrors())
            errors.count += 1
            errors.as_sent += abs(outcome.predicted_s - outcome.duration_s) / outcome.duration_s
            errors.given_length += abs(explained.e2e_s - outcome.duration_s) / outcome.duration_s
        self._drift.learn(route, outcome, explained)

    def _at_most_k(
        self, route: Route, state: LiveState, f: RequestFeatures, rho: float
    ) -> float | None:
        """A dynamic route's measured rate (accepted drafts per step / its most k) as the
        rate at that k of the a it shows at the K its batch gave; None where that K is 0
        (it drafted nothing: no measure of a)."""
        spec, here = self._routes[route], state.of(route)
        drafts = spec.k_at(min(here.load + max(f.n, 1), here.capacity or math.inf))
        if drafts <= 0:
            return None
        a = alpha_from_rate(min(1.0, rho * spec.k / drafts), drafts)
        return acceptance_rate(a, spec.k)

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
        gauges), its drafter's posterior mean; only workloads with a profile probe or a
        measurement of that drafter."""
        out: dict[Route, dict[Workload, float]] = {}
        for route in routes_of(self._active()):
            known = self._acceptance.drafter(route)
            if known is None:
                continue
            out[route] = {
                w: b.mean
                for w in Workload
                if (known[0], w, -1) in self._acceptance.beliefs
                or self._acceptance.probed(known[0], w)
                if (b := self._acceptance.workload_belief(route, w)) is not None
            }
        return out

    def acceptance_beliefs(self) -> dict[Route, dict[Workload, tuple[float, float, float]]]:
        """(mean rate rho, its sd, measured weight) per speculative route and workload
        seen or probed: the drafter's a at the route's k."""
        out: dict[Route, dict[Workload, tuple[float, float, float]]] = {}
        for route, believed in self.estimated_acceptance().items():
            k = route_of(self._active(), route).identity.num_speculative_tokens
            out[route] = {}
            for workload in believed:
                b = self._acceptance.workload_belief(route, workload)
                assert b is not None  # estimated_acceptance lists speculative routes only
                out[route][workload] = (acceptance_rate(b.mean, k), _rate_sd(b, k), b.n)
        return out

    def probe_misses(self) -> dict[Route, dict[Workload, tuple[float, float, float]]]:
        """(probes' a, answers' mean a, their weight) per speculative route and probed
        workload its drafter has answers for: what the probes' learned bias is made of."""
        out: dict[Route, dict[Workload, tuple[float, float, float]]] = {}
        for (drafter, workload, level), b in self._acceptance.beliefs.items():
            if level >= 0 or b.n <= 0 or not self._acceptance.probed(drafter, workload):
                continue
            for route, _ in self._acceptance.routes_of(drafter):
                out.setdefault(route, {})[workload] = (b.prior_mean, b.answers()[0], b.n)
        return out

    @property
    def probe_bias(self) -> float:
        """The probes' learned bias against the traffic (in a, an sd)."""
        return self._acceptance.probe_bias

    def shared_gpu(self, pair: int = 0) -> bool | None:
        if self._profile is None:
            return None
        return self._profile.shared_gpu

    def drift(self) -> dict[Route, float]:
        """Measured / profiled decode time per route (1.0: as profiled)."""
        return self._drift.factors()

    def error_totals(self) -> dict[Route, PredictionErrors]:
        return {r: e.since(None) for r, e in self._errors.items()}

    # ---- state that survives a restart (classifier/persistence.py) ---------------------

    def state_to_json(self) -> dict[str, Any]:
        beliefs = self._acceptance.beliefs
        return dump_state(LearnedState(beliefs, self._failures, self._outputs, self._traffic))

    def load_state(self, raw: object) -> None:
        """What an earlier process learned (persistence.parse_state says what is refused):
        all of it or, on a ValueError, nothing; its beliefs take this profile's priors."""
        drafters = {d for r in self._routes if (d := self._acceptance.drafter(r)) is not None}
        state = parse_state(raw, {r.value for r in self._routes}, {d for d, _ in drafters})
        self._acceptance.beliefs, self._failures = state.beliefs, state.failures
        self._outputs, self._traffic = state.outputs, state.traffic
        self._acceptance.use_profile(self._active())


def _rate_sd(belief: AcceptanceBelief, k: int) -> float:
    """The sd of rho = acceptance_rate(a, k) for a belief of a: half the rates one sd
    either side (rho is monotone in a)."""
    low, high = max(belief.mean - belief.sd, 0.0), min(belief.mean + belief.sd, 1.0)
    return 0.5 * (acceptance_rate(high, k) - acceptance_rate(low, k))


def _rounded(by_route: Mapping[Route, float], digits: int) -> dict[str, float]:
    return {r.value: round(v, digits) for r, v in by_route.items()}
