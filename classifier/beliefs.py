"""How acceptance is learned: a posterior per drafter, workload and temperature, of
the per-position acceptance a, from each answer's rho at its route's k.

rho is accepted drafts per decode step over k, every step counted, not vLLM's accepted /
drafted: on the real CPU pair a chat answer drafted on 2 of 61 steps at a rate of 0.38,
1.05 tokens a step where 1 + k * 0.38 says 2.5 (docs/decision.md).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from classifier.acceptance_model import AcceptanceModel
from classifier.features import RequestFeatures, Workload
from classifier.profile import EngineProfile
from classifier.speculation import acceptance_rate, alpha_from_rate
from classifier.types import Route

# A speculative answer shorter than this many tokens per sequence measures its
# acceptance coarsely (a few steps' worth) and counts proportionally less.
_FULL_WEIGHT_TOKENS = 32.0
# A workload no probe measured: per-position acceptance 0.5 worth one request, the middle of
# [0, 1] at the least weight that still gives the posterior a mean.
_NEUTRAL_A, _NEUTRAL_WEIGHT = 0.5, 1.0
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
# The probes' bias against the traffic (Acceptance.learn_probe_bias): the configured
# prior_sd / sqrt(probe_weight) counts as one probed key's evidence, and a key counts once
# it has two answers' weight, the least that measures their spread around their mean.
_BIAS_PRIOR_KEYS = 1.0
_BIAS_MIN_ANSWERS = 2.0

# A drafter's name (the method its routes serve, e.g. "eagle3"), a workload, and a
# temperature bucket (-1: the workload's): one belief, whatever the route's k.
BeliefKey = tuple[str, Workload, int]


@dataclass(slots=True)
class AcceptanceBelief:
    """Posterior of one key's mean per-position acceptance a (rho = acceptance_rate(a, k)):
    decayed sums of the answers' a and a prior worth prior_n requests of spread prior_sd.
    Normal on normal (docs/decision.md): answers that agree soon outweigh a probe that
    missed them. Drawn from for Thompson sampling, clipped into [0, 1]."""

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


def fine_key(drafter: str, f: RequestFeatures) -> BeliefKey:
    """The finer key: the drafter, workload and sampling temperature (greedy, low,
    moderate, high): acceptance falls with temperature within a workload."""
    bucket = sum(1 for bound in _TEMPERATURE_BUCKETS if f.temperature > bound)
    return drafter, f.workload, bucket


class Acceptance:
    """The beliefs per drafter, workload and temperature bucket (-1: the workload's), in
    per-position acceptance a: routes that serve one drafter at different k share what
    it learns (EAGLE at k=2 answers for EAGLE at k=6; a route's rho is
    acceptance_rate(a, its k)); and how far the probes of the profile in use sit from
    the traffic. A drafter is a route's served method, so two draft models of one
    method share a belief."""

    def __init__(
        self,
        prior_sd: float,
        probe_weight: float,
        memory: float,
        model: AcceptanceModel | None,
        profile: EngineProfile,
    ) -> None:
        """The figures are RouterConfig's; `model` the offline acceptance model, if any."""
        self.beliefs: dict[BeliefKey, AcceptanceBelief] = {}
        self._prior_sd, self._probes, self._model = prior_sd, probe_weight, model
        self._decay = 1.0 - 1.0 / memory
        self.probe_bias = prior_sd / math.sqrt(probe_weight)
        self.spread = prior_sd
        self._drafters: dict[Route, tuple[str, int]] = {}
        self._probe_a: dict[tuple[str, Workload], list[float]] = {}
        self.use_profile(profile)

    def use_profile(self, profile: EngineProfile) -> None:
        """A new profile's probes become each key's prior (what was learned stays)."""
        self._drafters, self._probe_a = {}, {}
        for measured in profile.routes:
            k = measured.identity.num_speculative_tokens
            if not (measured.speculative and k > 0):
                continue
            drafter = measured.identity.speculative
            self._drafters[Route(measured.name)] = (drafter, k)
            for workload, (tokens, _) in measured.tokens_per_step.items():
                a = alpha_from_rate(min(1.0, max(0.0, (tokens - 1.0) / k)), k)
                self._probe_a.setdefault((drafter, workload), []).append(a)
        for (drafter, workload, _), belief in self.beliefs.items():
            self.set_prior(belief, drafter, workload)
        self.learn_probe_bias()

    def drafter(self, route: Route) -> tuple[str, int] | None:
        """The route's drafter and k (None: no speculation)."""
        return self._drafters.get(route)

    def routes_of(self, drafter: str) -> list[tuple[Route, int]]:
        return [(r, k) for r, (d, k) in self._drafters.items() if d == drafter]

    def set_prior(self, belief: AcceptanceBelief, drafter: str, workload: Workload) -> None:
        probes = self._probe_a.get((drafter, workload))
        if probes:
            belief.prior_mean = sum(probes) / len(probes)
            belief.prior_n, belief.prior_sd = self._probe_weight(), self.spread
        else:  # no probe of this kind: a neutral guess worth one request
            belief.prior_mean, belief.prior_n = _NEUTRAL_A, _NEUTRAL_WEIGHT
            belief.prior_sd = self._prior_sd

    def _probe_weight(self) -> float:
        """A probe's worth, in requests of the learned spread: as sure as the probes'
        learned bias allows (its sd is the bias)."""
        return (self.spread / self.probe_bias) ** 2

    def probed(self, drafter: str, workload: Workload) -> bool:
        return (drafter, workload) in self._probe_a

    def learn_probe_bias(self) -> None:
        """How far the profile's probes sit from the traffic, learned across keys.

        The probed prior's uncertainty is this bias: each probed workload with answers
        measures it once, (answers' mean - probe)^2 less the answers' own sampling
        variance (an unbiased estimate of bias^2); the configured prior_sd /
        sqrt(probe_weight) counts as one key. A key not yet answered explores as much
        as the probes of the answered keys were wrong: on the measured H200's emulator
        they are within 0.014 but for chat, on real vLLM 0.137 RMS (docs/routes.md).
        """
        sd = self._prior_sd
        squares, keys = _BIAS_PRIOR_KEYS * sd**2 / self._probes, _BIAS_PRIOR_KEYS
        spreads, answers = _SPREAD_PRIOR_WEIGHT * sd**2, _SPREAD_PRIOR_WEIGHT
        for (drafter, workload, level), b in self.beliefs.items():
            if level >= 0 or b.n < _BIAS_MIN_ANSWERS or not self.probed(drafter, workload):
                continue
            mean, spread = b.answers()
            spread = max(spread, _VARIANCE_FLOOR)
            squares += (mean - b.prior_mean) ** 2 - spread / b.n
            keys += 1
            spreads += b.n * spread
            answers += b.n
        self.probe_bias = math.sqrt(max(squares / keys, _VARIANCE_FLOOR))
        self.spread = math.sqrt(spreads / answers)
        for (drafter, workload, _), b in self.beliefs.items():
            if self.probed(drafter, workload):
                b.prior_n, b.prior_sd = self._probe_weight(), self.spread

    def belief_for(self, route: Route, f: RequestFeatures) -> AcceptanceBelief | None:
        """The request's a on `route` (None: the route does not speculate): the finer
        key's belief if it has any data, else the workload's; a workload not measured
        yet takes the offline model's prediction for this very request (`specroute
        train` on the outcome log) as its prior mean, where one is given."""
        known = self._drafters.get(route)
        if known is None:
            return None
        drafter = known[0]
        fine = self.beliefs.get(fine_key(drafter, f))
        if fine is not None and fine.n > 0:
            return fine
        belief = self._workload(drafter, f.workload)
        if self._model is None or belief.n > 0:
            return belief
        return AcceptanceBelief(self._model.predict(f), self._probes, self._prior_sd)

    def rate(self, route: Route, f: RequestFeatures) -> float:
        """The request's mean acceptance rate rho on `route` (0 without speculation)."""
        belief = self.belief_for(route, f)
        return 0.0 if belief is None else acceptance_rate(belief.mean, self._drafters[route][1])

    def workload_rate(self, route: Route, workload: Workload) -> float:
        """The workload's mean rho on `route` (0 without speculation)."""
        belief = self.workload_belief(route, workload)
        return 0.0 if belief is None else acceptance_rate(belief.mean, self._drafters[route][1])

    def workload_belief(self, route: Route, workload: Workload) -> AcceptanceBelief | None:
        known = self._drafters.get(route)
        return None if known is None else self._workload(known[0], workload)

    def _workload(self, drafter: str, workload: Workload) -> AcceptanceBelief:
        known = self.beliefs.get((drafter, workload, -1))
        if known is not None:
            return known
        fresh = AcceptanceBelief(_NEUTRAL_A, _NEUTRAL_WEIGHT, self._prior_sd)
        self.set_prior(fresh, drafter, workload)
        return fresh

    def observe(self, route: Route, f: RequestFeatures, rho: float, per_seq: float) -> None:
        """One answer's measured rate on `route`, as its drafter's a, into its
        workload's key and its finer key."""
        known = self._drafters.get(route)
        if per_seq < 2 or known is None:
            return
        drafter, k = known
        a = alpha_from_rate(rho, k)
        weight = min(1.0, per_seq / _FULL_WEIGHT_TOKENS)
        for key in ((drafter, f.workload, -1), fine_key(drafter, f)):
            belief = self.beliefs.get(key)
            if belief is None:
                belief = self.beliefs[key] = self._workload(drafter, f.workload)
                if key[2] >= 0:  # the finer key starts from its workload's mean
                    belief = self.beliefs[key] = AcceptanceBelief(
                        belief.mean, belief.prior_n, belief.prior_sd
                    )
            belief.observe(a, weight, self._decay)
        self.learn_probe_bias()
