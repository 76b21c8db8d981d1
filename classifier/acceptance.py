"""Predicted draft acceptance per request, refined online from measured acceptance.

Acceptance here is the per-position probability a of speculation.py (what the
Leviathan formula and the emulator's knobs mean). The gateway measures vLLM's
accepted / proposed drafts per request; observe() converts that to a with
alpha_from_rate, so priors, estimates and metrics all speak one unit.

A request's estimate is a base (the config prior of its workload, or the
offline model's prediction when one is loaded) plus a learned correction,
looked up at three levels of detail:

    workload
    workload, code_like, temperature bucket
    workload, code_like, temperature bucket, prompt length bucket

Each level's correction is its decayed mean residual shrunk toward the level
above: the workload's toward 0 (the base) with prior_weight pseudo-observations,
each finer key toward its coarser one with backoff_weight. The two differ on
purpose: the shipped prior is neutral, a guess worth about one request, while a
fine key's parent is a measurement worth trusting over a few of its own. A fine
key with few samples therefore says what its coarser key says, and earns its own
voice as data arrives: Beta-style counts with back-off, no hard thresholds. Old
observations fade (memory), so the estimate follows a changed draft model or
traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from classifier.acceptance_model import AcceptanceModel
from classifier.features import RequestFeatures, Workload
from classifier.speculation import alpha_from_rate

__all__ = [
    "NEUTRAL_ACCEPTANCE",
    "AcceptanceEstimator",
    "AcceptancePriors",
    "prompt_bucket",
    "temperature_bucket",
]


# Written as comparisons, not loops over a bounds tuple: this is on the
# decision path and a generator costs more than the whole lookup.
def temperature_bucket(temperature: float) -> int:
    """0: greedy-ish (<= 0.05), 1: low (<= 0.5), 2: moderate (<= 1), 3: above 1."""
    if temperature <= 0.5:
        return 0 if temperature <= 0.05 else 1
    return 2 if temperature <= 1.0 else 3


def prompt_bucket(prompt_tokens: int) -> int:
    """0: < 256 tokens, 1: < 1024, 2: < 4096, 3: longer."""
    if prompt_tokens < 1024:
        return 0 if prompt_tokens < 256 else 1
    return 2 if prompt_tokens < 4096 else 3


# The default priors are deliberately NEUTRAL: one value for every workload,
# not a measurement and not taken from a paper. Acceptance depends on the draft
# model, the target, the task and the sampling settings, so no published figure
# describes a given deployment; the router says it does not know which workload
# drafts well until it has measured. 0.6 rather than 0.5: at the shipped k = 4
# and c = 0.1 it predicts speculation faster on an idle GPU for every workload,
# so each workload's acceptance is measured from its first requests on instead
# of waiting for exploration. The emulator's truth (tooling/emulator/CALIBRATION.md,
# 0.80 / 0.75 / 0.50 / 0.25) is a separate source and differs from it on purpose:
# 0.2 below structured output's, 0.35 above creative text's.
NEUTRAL_ACCEPTANCE = 0.6


@dataclass(frozen=True, slots=True)
class AcceptancePriors:
    """Per-position acceptance a to start from, per workload (config); neutral by default."""

    structured: float = NEUTRAL_ACCEPTANCE
    code: float = NEUTRAL_ACCEPTANCE
    chat: float = NEUTRAL_ACCEPTANCE
    creative: float = NEUTRAL_ACCEPTANCE
    long_context: float = NEUTRAL_ACCEPTANCE
    # Pseudo-observations behind the prior: a neutral guess yields to the first
    # measurements (at 5, creative text measured at 0.09 was still believed
    # 0.29 after 10 requests and kept on the speculative server).
    prior_weight: float = 1.0
    backoff_weight: float = 5.0  # behind each back-off to the coarser key (a measurement)
    memory: float = 1000.0  # observations per key before old ones have faded to 1/e

    def __post_init__(self) -> None:
        values = (self.structured, self.code, self.chat, self.creative, self.long_context)
        if not all(0.0 <= v <= 1.0 for v in values):
            raise ValueError("acceptance priors must be in [0, 1]")
        if not (self.prior_weight > 0 and self.backoff_weight > 0 and self.memory >= 1):
            raise ValueError(
                "acceptance priors: need prior_weight > 0, backoff_weight > 0 and memory >= 1"
            )

    def of(self, workload: Workload) -> float:
        value: float = getattr(self, workload.value)
        return value


# Per key: [decayed weight, decayed sum of residuals, decayed sum of bases].
_Stats = list[float]
_Key = Workload | tuple[Workload, bool, int] | tuple[Workload, bool, int, int]


class AcceptanceEstimator:
    """Per-request a: base (prior or offline model) + hierarchical online correction."""

    __slots__ = ("_backoff", "_decay", "_k", "_model", "_priors", "_stats", "_weight")

    def __init__(
        self,
        priors: AcceptancePriors,
        num_speculative_tokens: int,
        model: AcceptanceModel | None = None,
    ) -> None:
        self._priors = {w: priors.of(w) for w in Workload}
        self._weight = priors.prior_weight
        self._backoff = priors.backoff_weight
        self._decay = 1.0 - 1.0 / priors.memory
        self._k = num_speculative_tokens
        self._model = model
        self._stats: dict[_Key, _Stats] = {}

    def _base(self, f: RequestFeatures) -> float:
        if self._model is not None:
            return self._model.predict(f)
        return self._priors[f.workload]

    def _keys(self, f: RequestFeatures) -> tuple[_Key, _Key, _Key]:
        mid = (f.workload, f.code_like, temperature_bucket(f.temperature))
        return f.workload, mid, (*mid, prompt_bucket(f.prompt_tokens))

    def predict(self, f: RequestFeatures) -> float:
        """Expected per-position acceptance a of this request, in [0, 1]."""
        correction = 0.0
        m = self._weight
        for key in self._keys(f):
            stats = self._stats.get(key)
            if stats is None:
                break  # finer keys exist only under an existing coarser one
            correction = (stats[1] + m * correction) / (stats[0] + m)
            m = self._backoff
        return min(1.0, max(0.0, self._base(f) + correction))

    def observe(self, f: RequestFeatures, acceptance_rate: float, weight: float = 1.0) -> None:
        """Learn from one request: acceptance_rate is accepted / proposed drafts (vLLM's)."""
        if not (math.isfinite(acceptance_rate) and math.isfinite(weight)) or weight <= 0:
            return
        alpha = alpha_from_rate(acceptance_rate, self._k)
        base = self._base(f)
        residual = alpha - base
        for key in self._keys(f):
            stats = self._stats.setdefault(key, [0.0, 0.0, 0.0])
            stats[0] = stats[0] * self._decay + weight
            stats[1] = stats[1] * self._decay + weight * residual
            stats[2] = stats[2] * self._decay + weight * base

    def by_workload(self) -> dict[Workload, float]:
        """The current a per workload (its mean base plus its correction), for metrics."""
        out: dict[Workload, float] = {}
        m = self._weight
        for w in Workload:
            stats = self._stats.get(w)
            if stats is None:
                out[w] = self._priors[w]
                continue
            base = (stats[2] + m * self._priors[w]) / (stats[0] + m)
            out[w] = min(1.0, max(0.0, base + stats[1] / (stats[0] + m)))
        return out

    def count(self, workload: Workload) -> float:
        """Decayed number of observations behind one workload's estimate."""
        stats = self._stats.get(workload)
        return stats[0] if stats else 0.0

    def samples(self) -> dict[Workload, float]:
        """Decayed number of observations behind each workload's estimate."""
        return {w: (s[0] if (s := self._stats.get(w)) else 0.0) for w in Workload}
