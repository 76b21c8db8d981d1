"""How many tokens an answer will really have, learned per kind of request.

features.expected_output_tokens is max_tokens (or a config default); real answers
often stop earlier (EOS, a closed JSON object). The ratio is learned per (workload,
max_tokens given?), a decayed mean shrunk toward 1 while there is little data. It
hardly changes which route wins (every route decodes the same answer) but it is most
of what makes the predicted latencies match the measured ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from classifier.features import RequestFeatures, Workload

__all__ = ["OutputLengthModel"]

# With no max_tokens the expectation is a config guess; the truth may be longer.
_MAX_RATIO_UNBOUNDED = 16.0


class OutputLengthModel:
    """Expected output tokens per sequence = expected_output_tokens x learned ratio."""

    __slots__ = ("_decay", "_prior_weight", "_stats")

    def __init__(self, *, prior_weight: float = 5.0, memory: float = 500.0) -> None:
        self._prior_weight = prior_weight
        self._decay = 1.0 - 1.0 / max(memory, 1.0)
        # (workload, max_tokens given) -> [decayed count, decayed sum of ratios]
        self._stats: dict[tuple[Workload, bool], list[float]] = {}

    def ratio(self, features: RequestFeatures) -> float:
        stats = self._stats.get((features.workload, features.max_tokens is not None))
        if stats is None:
            return 1.0
        n, total = stats
        return (total + self._prior_weight) / (n + self._prior_weight)

    def predict(self, features: RequestFeatures) -> float:
        return features.expected_output_tokens * self.ratio(features)

    def observe(self, features: RequestFeatures, completion_tokens: int) -> None:
        """completion_tokens as the backend's usage reports it (all n choices together)."""
        expected = features.expected_output_tokens
        if expected <= 0 or completion_tokens < 0:
            return
        bounded = features.max_tokens is not None
        ratio = completion_tokens / max(features.n, 1) / expected
        ratio = min(ratio, 1.0 if bounded else _MAX_RATIO_UNBOUNDED)
        stats = self._stats.setdefault((features.workload, bounded), [0.0, 0.0])
        stats[0] = stats[0] * self._decay + 1.0
        stats[1] = stats[1] * self._decay + ratio

    def to_json(self) -> dict[str, list[float]]:
        """The learned ratios, for a state file (`routing.state_path`)."""
        return {f"{w.value}/{int(b)}": list(s) for (w, b), s in self._stats.items()}

    @staticmethod
    def from_json(raw: Mapping[str, Any]) -> OutputLengthModel:
        model = OutputLengthModel()
        for key, values in raw.items():
            name, _, bounded = str(key).partition("/")
            if not (isinstance(values, list) and len(values) == 2):
                raise ValueError(f"output lengths: bad entry {key!r}")
            model._stats[(Workload(name), bounded == "1")] = [float(values[0]), float(values[1])]
        return model
