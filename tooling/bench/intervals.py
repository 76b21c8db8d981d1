"""Bootstrap intervals for the bench's and advise's ratios (speedups, regrets).

Every ratio the bench reports is a ratio of sums over the same requests, one
sum per side (baseline e2e / target e2e; gateway e2e / oracle e2e). Its
interval is the percentile bootstrap, paired: the requests are drawn with
replacement, each one's two sides together, RESAMPLES times, and the ratio of
the drawn sums is taken each time; the interval holds the middle LEVEL of
those ratios. The generator is seeded (SEED), so the same results give the
same interval on every run and machine.

A speedup whose interval holds 1.0 is `inconclusive`: the requests measured
cannot tell faster from slower. Below MIN_PAIRS requests there is no interval
at all (a bootstrap of a handful is too narrow to trust), which counts as
inconclusive too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

LEVEL = 0.95
RESAMPLES = 2000
SEED = 0
MIN_PAIRS = 5
_CELLS = 2_000_000  # drawn indices held at once (RESAMPLES x requests, in chunks)


@dataclass(frozen=True, slots=True)
class Interval:
    lo: float
    hi: float

    @property
    def crosses_one(self) -> bool:
        return self.lo <= 1.0 <= self.hi

    def to_json(self) -> list[float]:
        return [self.lo, self.hi]

    @classmethod
    def of(cls, value: object) -> Interval | None:
        """From its JSON form ([lo, hi]); None for null or anything else."""
        if isinstance(value, list | tuple) and len(value) == 2:
            lo, hi = value
            if isinstance(lo, int | float) and isinstance(hi, int | float):
                return cls(float(lo), float(hi))
        return None


def conclusion(ci: Interval | None) -> str:
    """faster, slower or inconclusive, for a speedup (higher is better) with its interval."""
    if ci is None or ci.crosses_one:
        return "inconclusive"
    return "faster" if ci.lo > 1.0 else "slower"


def describe() -> dict[str, object]:
    """How the intervals were made, for the bench JSON."""
    return {
        "method": "percentile bootstrap, paired by request",
        "level": LEVEL,
        "resamples": RESAMPLES,
        "seed": SEED,
        "min_pairs": MIN_PAIRS,
    }


def ratio_of_sums(
    num: Sequence[float], den: Sequence[float], *, digits: int = 4
) -> Interval | None:
    """sum(num) / sum(den) over paired values (num[i] and den[i] are one request)."""
    if len(num) != len(den):
        raise ValueError("ratio_of_sums: the two sides must pair up")
    if len(num) < MIN_PAIRS:
        return None
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)

    def ratio(idx: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(a[idx].sum(axis=1) / b[idx].sum(axis=1), dtype=np.float64)

    return _percentiles(_draw(len(a), ratio), digits)


def resampled(
    samples: Sequence[npt.ArrayLike],
    statistic: Callable[[list[npt.NDArray[np.float64]]], float | None],
    *,
    digits: int = 4,
    resamples: int = RESAMPLES,
) -> Interval | None:
    """A statistic of several independent samples (each drawn on its own, with
    replacement): for figures that are not paired, such as a ratio of two routes'
    medians from an outcome log; a 2-D sample's rows are drawn whole. None when a sample
    has fewer than MIN_PAIRS values (rows)."""
    arrays = [np.asarray(s, dtype=float) for s in samples]
    if not arrays or any(len(x) < MIN_PAIRS for x in arrays):
        return None
    rng = np.random.default_rng(SEED)
    values = []
    for _ in range(resamples):
        drawn = [x[rng.integers(0, len(x), size=len(x))] for x in arrays]
        value = statistic(drawn)
        if value is not None:
            values.append(value)
    return _percentiles(np.asarray(values, dtype=float), digits)


def _draw(
    n: int, ratio: Callable[[npt.NDArray[np.intp]], npt.NDArray[np.float64]]
) -> npt.NDArray[np.float64]:
    rng = np.random.default_rng(SEED)
    out = np.empty(RESAMPLES)
    rows = max(1, _CELLS // n)
    for start in range(0, RESAMPLES, rows):
        m = min(rows, RESAMPLES - start)
        out[start : start + m] = ratio(rng.integers(0, n, size=(m, n)))
    return out


def _percentiles(values: npt.NDArray[np.float64], digits: int) -> Interval | None:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    tail = (1.0 - LEVEL) / 2 * 100
    lo, hi = np.percentile(values, [tail, 100.0 - tail])
    return Interval(round(float(lo), digits), round(float(hi), digits))
