"""What the traffic looks like: its workloads, their prompts and answers, its load.

The router prices a batch before it forms: which workloads will fill it (Traffic.coming),
their prompts (each arrival's prefill lengthens everyone's steps) and answers, and how
many requests the GPU usually holds; learned from the last `memory` answers. Under
steady mixed traffic a few in flight do not move the batch; in bursts of one kind the
requests in flight say what comes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from classifier.features import Workload

__all__ = ["Traffic"]


@dataclass(slots=True)
class _Kind:
    answers: float = 0.0  # decayed count
    prompt_tokens: float = 0.0  # decayed sums
    output_tokens: float = 0.0


@dataclass(slots=True)
class Traffic:
    """Decayed statistics of the answers seen (the router's only writer is learn())."""

    memory: float
    kinds: dict[Workload, _Kind] = field(default_factory=dict)
    load: float = 0.0  # decayed sum of the requests in flight at each answer's decision
    follows: float = 0.0  # decayed count of answers of the same kind as the one before
    pairs: float = 0.0  # decayed count of answers after another
    last: Workload | None = None

    def observe(self, workload: Workload, prompt: float, output: float, load: float) -> None:
        keep = 1.0 - 1.0 / self.memory
        for kind in self.kinds.values():
            kind.answers *= keep
            kind.prompt_tokens *= keep
            kind.output_tokens *= keep
        if self.last is not None:
            self.pairs = self.pairs * keep + 1.0
            self.follows = self.follows * keep + float(workload is self.last)
        self.last = workload
        kind = self.kinds.setdefault(workload, _Kind())
        kind.answers += 1.0
        kind.prompt_tokens += prompt
        kind.output_tokens += output
        self.load = self.load * keep + load

    @property
    def seen(self) -> float:
        return sum(k.answers for k in self.kinds.values())

    def shares(self) -> dict[Workload, float]:
        """Decayed answers per workload (not normalised)."""
        return {w: k.answers for w, k in self.kinds.items()}

    def expected_load(self) -> float:
        """Requests in flight on the GPU at the traffic's decisions, on average, each one
        counting itself (0: nothing seen yet)."""
        seen = self.seen
        return self.load / seen if seen > 0 else 0.0

    def stickiness(self) -> float:
        """How much the next answer's kind follows the last, above chance: 0 for steady
        mixed traffic, 1 for bursts of one kind (0 before two answers)."""
        seen = self.seen
        if seen <= 0 or self.pairs <= 0:
            return 0.0
        chance = sum((k.answers / seen) ** 2 for k in self.kinds.values())
        if chance >= 1.0:
            return 1.0
        return min(1.0, max(0.0, (self.follows / self.pairs - chance) / (1.0 - chance)))

    def coming(self, in_flight: Mapping[Workload, float]) -> dict[Workload, float]:
        """The kinds of the next requests, as shares summing to 1: the kinds in flight
        by the traffic's stickiness, the traffic's shares for the rest.

        The requests in flight are a sample of the traffic too, one not yet answered:
        they count in its shares beside the answers (a fresh gateway at c=32 had one
        answer, structured, and 34 requests of every kind in flight)."""
        seen, flying = self.seen, sum(in_flight.values())
        if flying <= 0 and seen <= 0:
            return {}
        follow = self.stickiness() if flying > 0 else 0.0
        out = {
            w: (1.0 - follow) * (k.answers + in_flight.get(w, 0.0)) / (seen + flying)
            for w, k in self.kinds.items()
        }
        for workload, n in in_flight.items():
            out[workload] = out.get(workload, 0.0) + follow * n / flying
            if workload not in self.kinds:
                out[workload] += (1.0 - follow) * n / (seen + flying)
        return out

    def mean_prompt(self, shares: Mapping[Workload, float]) -> float:
        """Prompt tokens of a request drawn from `shares` (0 where nothing is known)."""
        return self._mean(shares, "prompt_tokens")

    def mean_output(self, shares: Mapping[Workload, float]) -> float:
        """Completion tokens per sequence of a request drawn from `shares` (at least 1)."""
        return max(self._mean(shares, "output_tokens"), 1.0)

    def output_weights(self, shares: Mapping[Workload, float]) -> dict[Workload, float]:
        """Each workload's share of the tokens `shares` will generate: its share times
        its mean completion; a workload not answered yet counts the mix's mean."""
        mean = self._mean(shares, "output_tokens") or 1.0
        out = {}
        for workload, share in shares.items():
            seen = self._per_answer(workload, "output_tokens")
            out[workload] = share * (mean if seen is None else seen)
        return out

    def _mean(self, shares: Mapping[Workload, float], what: str) -> float:
        weight = total = 0.0
        for workload, share in shares.items():
            seen = self._per_answer(workload, what)
            if seen is not None:
                weight += share
                total += share * seen
        return total / weight if weight > 0 else 0.0

    def _per_answer(self, workload: Workload, what: str) -> float | None:
        """A kind's mean prompt or output tokens; None before its first answer."""
        kind = self.kinds.get(workload)
        if kind is None or kind.answers <= 0:
            return None
        return float(getattr(kind, what)) / kind.answers

    def to_json(self) -> dict[str, object]:
        return {
            "kinds": {
                w.value: [k.answers, k.prompt_tokens, k.output_tokens]
                for w, k in self.kinds.items()
            },
            "load": self.load,
            "follows": [self.follows, self.pairs],
        }

    def load_json(self, raw: object) -> None:
        """A state's traffic: {"kinds": {workload: [answers, prompt, output]}, "load"};
        or the shape before it (workload: answers), its lengths then unknown. Anything
        else is refused (ValueError) and nothing is taken."""
        kinds: dict[Workload, _Kind] = {}
        load = 0.0
        follows = pairs = 0.0
        if isinstance(raw, Mapping) and set(raw) <= {"kinds", "load", "follows"} and "kinds" in raw:
            table, load = raw["kinds"], _number(raw.get("load", 0.0), "traffic load")
            pair = raw.get("follows", [0.0, 0.0])
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ValueError("router state: traffic follows: want 2 figures")
            follows, pairs = (_number(v, "traffic follows") for v in pair)
            if follows > pairs:
                raise ValueError("router state: traffic follows: more than the pairs")
        else:
            table = raw
        if not isinstance(table, Mapping):
            raise ValueError("router state: traffic: want a table")
        for key, value in table.items():
            figures = value if isinstance(value, list) else [value, 0.0, 0.0]
            if len(figures) != 3:
                raise ValueError(f"router state: traffic {key!r}: want 3 figures")
            answers, prompt, output = (_number(v, f"traffic {key!r}") for v in figures)
            kinds[Workload(str(key))] = _Kind(answers, prompt, output)
        self.kinds, self.load, self.follows, self.pairs = kinds, load, follows, pairs


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"router state: {what}: want a number")
    number = float(value)
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"router state: {what}: want a finite number >= 0")
    return number
