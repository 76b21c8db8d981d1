"""How acceptance is learned: a posterior per route, workload and temperature.

rho is accepted drafts per decode step over k, every step counted: not vLLM's
accepted / drafted, which counts only the steps that drafted. vLLM's n-gram
drafter proposes nothing where the text has no match; on the real CPU pair a
chat answer drafted on 2 of 61 steps at a rate of 0.38, 1.05 tokens a step
where 1 + k * 0.38 says 2.5 (gateway/wire/acceptance.py).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from classifier.acceptance_model import AcceptanceModel
from classifier.cost import route_of
from classifier.features import RequestFeatures, Workload
from classifier.profile import EngineProfile
from classifier.speculation import acceptance_rate
from classifier.types import Route

# A speculative answer shorter than this many tokens per sequence measures its
# acceptance coarsely (a few steps' worth) and counts proportionally less.
_FULL_WEIGHT_TOKENS = 32.0
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
# The probes' bias against the traffic (Acceptance.learn_probe_bias): the configured
# prior_sd / sqrt(probe_weight) counts as one probed key's evidence, and a key counts once
# it has two answers' weight, the least that measures their spread around their mean.
_BIAS_PRIOR_KEYS = 1.0
_BIAS_MIN_ANSWERS = 2.0

BeliefKey = tuple[Route, Workload, int]


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


def fine_key(route: Route, f: RequestFeatures) -> BeliefKey:
    """The finer key: the route, workload and sampling temperature (greedy, low,
    moderate, high): acceptance falls with temperature within a workload."""
    bucket = sum(1 for bound in _TEMPERATURE_BUCKETS if f.temperature > bound)
    return route, f.workload, bucket


class Acceptance:
    """The beliefs per route, workload and temperature bucket (-1: the workload's): one
    route's acceptance is never another's (a different drafter or k accepts differently);
    and how far the probes of `profile`, the one in use, sit from the traffic."""

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
        self.spread, self.profile = prior_sd, profile
        self.bucket_sd = prior_sd

    def use_profile(self, profile: EngineProfile) -> None:
        """A new profile's probes become each key's prior (what was learned stays)."""
        self.profile = profile
        for (route, workload, level), belief in self.beliefs.items():
            if level < 0:  # a bucket keeps the prior it borrowed
                self.set_prior(belief, route, workload)
        self.learn_probe_bias()

    def set_prior(self, belief: AcceptanceBelief, route: Route, workload: Workload) -> None:
        measured = route_of(self.profile, route)
        probe = measured.tokens_per_step.get(workload)
        k = measured.identity.num_speculative_tokens
        if probe is not None and k > 0:
            belief.prior_mean = min(1.0, max(0.0, (probe[0] - 1.0) / k))
            belief.prior_n, belief.prior_sd = self._probe_weight(), self.spread
        else:  # no probe of this kind: a neutral guess worth one request
            belief.prior_mean, belief.prior_n = _NEUTRAL_RATE, _NEUTRAL_WEIGHT
            belief.prior_sd = self._prior_sd

    def _probe_weight(self) -> float:
        """A probe's worth, in requests of the learned spread: as sure as the probes'
        learned bias allows (its sd is the bias)."""
        return (self.spread / self.probe_bias) ** 2

    def probed(self, route: Route, workload: Workload) -> bool:
        measured = route_of(self.profile, route)
        return measured.speculative and workload in measured.tokens_per_step

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
        for (route, workload, level), b in self.beliefs.items():
            if level >= 0 or b.n < _BIAS_MIN_ANSWERS or not self.probed(route, workload):
                continue
            mean, spread = b.answers()
            spread = max(spread, _VARIANCE_FLOOR)
            squares += (mean - b.prior_mean) ** 2 - spread / b.n
            keys += 1
            spreads += b.n * spread
            answers += b.n
        self.probe_bias = math.sqrt(max(squares / keys, _VARIANCE_FLOOR))
        self.spread = math.sqrt(spreads / answers)
        self.bucket_sd = self._learn_bucket_sd()
        for (route, workload, level), b in self.beliefs.items():
            if level < 0 and self.probed(route, workload):
                b.prior_n, b.prior_sd = self._probe_weight(), self.spread

    def _learn_bucket_sd(self) -> float:
        """How far a temperature bucket's mean sits from its workload's, learned across
        the buckets with answers as the probes' bias is: each measures it once, (its
        answers' mean - the workload's)^2 less its own sampling variance; the configured
        prior_sd counts as one bucket. A bucket with no answers borrows its workload's
        mean at this much more uncertainty: on the measured H200's emulator a request
        labelled chat at T=0 (text-to-SQL) accepted 0.40 on EAGLE k=6 where chat at
        T=0.8 had taught 0.11-0.22 with an sd of 0.03, and the router, sure of the
        borrowed belief, never tried it (issue 52)."""
        squares, buckets = self._prior_sd**2, 1.0
        for (route, workload, level), b in self.beliefs.items():
            if level < 0 or b.n < _BIAS_MIN_ANSWERS:
                continue
            whole = self.beliefs.get((route, workload, -1))
            if whole is None or whole.n <= b.n:  # one bucket is its workload: no distance
                continue
            mean, spread = b.answers()
            squares += (mean - whole.answers()[0]) ** 2 - max(spread, _VARIANCE_FLOOR) / b.n
            buckets += 1
        return math.sqrt(max(squares / buckets, _VARIANCE_FLOOR))

    def belief_for(self, route: Route, f: RequestFeatures) -> AcceptanceBelief:
        """The finer key's belief if it has any data, else the workload's, borrowed at
        bucket_sd more uncertainty; a workload not measured yet takes the offline
        model's prediction for this very request (`specroute train` on the outcome log)
        as its prior mean, where one is given."""
        fine = self.beliefs.get(fine_key(route, f))
        if fine is not None and fine.n > 0:
            return fine
        belief = self.workload_belief(route, f.workload)
        k = route_of(self.profile, route).identity.num_speculative_tokens
        if self._model is None or belief.n > 0 or k <= 0:
            return self._borrowed(belief)
        rate = acceptance_rate(self._model.predict(f), k)
        return AcceptanceBelief(rate, self._probes, self._prior_sd)

    def _borrowed(self, whole: AcceptanceBelief) -> AcceptanceBelief:
        """A bucket's prior: its workload's mean, as unsure as that mean plus the
        learned distance between a workload's buckets (worth one request)."""
        return AcceptanceBelief(whole.mean, 1.0, math.hypot(whole.sd, self.bucket_sd))

    def rate(self, route: Route, f: RequestFeatures) -> float:
        return self.belief_for(route, f).mean

    def workload_belief(self, route: Route, workload: Workload) -> AcceptanceBelief:
        known = self.beliefs.get((route, workload, -1))
        if known is not None:
            return known
        fresh = AcceptanceBelief(_NEUTRAL_RATE, _NEUTRAL_WEIGHT, self._prior_sd)
        self.set_prior(fresh, route, workload)
        return fresh

    def observe(self, route: Route, f: RequestFeatures, rho: float, per_seq: float) -> None:
        """One answer's measured acceptance, into its workload's key and its finer key."""
        if per_seq < 2:
            return
        weight = min(1.0, per_seq / _FULL_WEIGHT_TOKENS)
        for key in ((route, f.workload, -1), fine_key(route, f)):
            belief = self.beliefs.get(key)
            if belief is None:
                belief = self.beliefs[key] = self.workload_belief(route, f.workload)
                if key[2] >= 0:  # the finer key starts from its workload's, borrowed
                    belief = self.beliefs[key] = self._borrowed(belief)
            belief.observe(rho, weight, self._decay)
        self.learn_probe_bias()
