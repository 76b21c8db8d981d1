"""Per-workload draft acceptance from vLLM's server-wide speculative counters.

Why: vLLM reports acceptance per request only with
`--per-request-spec-decode-metrics` (off by default). Without it there are two
counters for the whole server, drafted and accepted tokens, and the router
would keep its priors forever. Those counters still carry the answer: in a
vLLM batch every decoding sequence gets k draft tokens per engine step, so a
request's share of a window's drafted tokens is its share of the window's
decoding time (first token to end, times its n sequences). Per scrape window
w and key j (a workload):

    accepted_w ~= sum_j rate_j * drafted_w * p_wj,   p_wj = decode_s_wj / sum_i decode_s_wi

Weighted least squares (weight 1 / drafted_w: a count's variance grows with
its size), every window faded by exp(-drafted_w / memory), solved for rates in
[0, 1]:

    M = sum_w drafted_w p_w p_w^T,   b = sum_w accepted_w p_w,   minimise r^T M r - 2 b^T r

A window with one key in it adds drafted to M_jj and accepted to b_j, so with
one request in flight the estimate is exactly accepted / drafted. A rate is
used once its standard error, sqrt(variance per drafted token x (M^-1)_jj), is
small: mixed windows separate keys only as far as their proportions vary, and
the variance is the fit's own residual when the windows fit worse than noise
would. The state is M (K x K), b (K) and two scalars whatever the number of
windows; `DecodeLog` keeps the decoding intervals between two scrapes, bounded
in entries.

Pure: times are arguments (the caller owns the clock), no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Attributed", "CounterAttribution", "DecodeLog"]

MEMORY_DRAFT_TOKENS = 200_000.0  # drafted tokens after which a window's weight is 1/e
# Variance of accepted/drafted per drafted token that noise alone gives: at most
# k/4 (a step accepts 0..k of its k drafts); 1.0 is k = 4's bound. The fit's own
# residual variance replaces it when larger (the model fits the windows worse).
NOISE_FLOOR = 1.0
MAX_STDERR = 0.03  # a rate is used once its standard error is below this
_SWEEPS = 200  # coordinate-descent sweeps at most per solve (K is 5)
_CONVERGED = 1e-12
_RIDGE = 1e-9  # relative, only to invert M for the support of each rate


@dataclass(frozen=True, slots=True)
class Attributed:
    """One key's rate (accepted / drafted tokens) and the evidence behind it."""

    rate: float
    # Drafted tokens the rate rests on once the other keys' share is accounted
    # for: 1 / (M^-1)_jj. A key only ever seen together with another in the
    # same proportions is not identifiable and has support near 0.
    support: float
    stderr: float  # sqrt(variance per drafted token / support)


class CounterAttribution:
    """Decayed least squares of window counter deltas on per-key decoding shares."""

    __slots__ = (
        "_aa",
        "_b",
        "_index",
        "_keys",
        "_m",
        "_max_stderr",
        "_memory",
        "_noise_floor",
        "_rates",
        "_stderr",
        "_support",
        "_windows",
    )

    def __init__(
        self,
        keys: Sequence[str],
        *,
        memory_draft_tokens: float = MEMORY_DRAFT_TOKENS,
        noise_floor: float = NOISE_FLOOR,
        max_stderr: float = MAX_STDERR,
    ) -> None:
        if not keys or len(set(keys)) != len(keys):
            raise ValueError("attribution: keys must be distinct and at least one")
        if not (memory_draft_tokens > 0 and noise_floor > 0 and max_stderr > 0):
            raise ValueError("attribution: memory, noise floor and max stderr must be > 0")
        self._keys = tuple(keys)
        self._index = {k: i for i, k in enumerate(self._keys)}
        n = len(self._keys)
        self._m = [[0.0] * n for _ in range(n)]
        self._b = [0.0] * n
        self._aa = 0.0  # decayed sum of accepted^2 / drafted: the residual's constant term
        self._windows = 0.0  # decayed number of windows, for the residual's degrees of freedom
        self._rates = [0.5] * n  # a warm start for the solver, never reported unsupported
        self._support = [0.0] * n
        self._stderr = [math.inf] * n
        self._memory = memory_draft_tokens
        self._noise_floor = noise_floor
        self._max_stderr = max_stderr

    def observe(self, drafted: float, accepted: float, decode_s: Mapping[str, float]) -> bool:
        """Take one window's counter deltas and its decoding seconds per key.

        Returns False, learning nothing, for a window that cannot be attributed:
        no drafts, accepted outside [0, drafted] (a counter reset read as a
        delta), no decoding time, or time under a key it does not know (whose
        drafts would otherwise land on the others).
        """
        if not (math.isfinite(drafted) and math.isfinite(accepted)):
            return False
        if drafted <= 0 or not 0 <= accepted <= drafted:
            return False
        shares = [0.0] * len(self._keys)
        for key, seconds in decode_s.items():
            if not (math.isfinite(seconds) and seconds >= 0):
                return False
            if seconds == 0:
                continue
            i = self._index.get(key)
            if i is None:
                return False
            shares[i] += seconds
        total = sum(shares)
        if total <= 0:
            return False
        p = [s / total for s in shares]
        fade = math.exp(-drafted / self._memory)
        m, b = self._m, self._b
        for i, pi in enumerate(p):
            b[i] = b[i] * fade + accepted * pi
            row = m[i]
            for j, pj in enumerate(p):
                row[j] = row[j] * fade + drafted * pi * pj
        self._aa = self._aa * fade + accepted * accepted / drafted
        self._windows = self._windows * fade + 1.0
        self._solve()
        return True

    def estimate(self, key: str) -> Attributed | None:
        """The key's rate once its standard error is small enough, else None."""
        i = self._index.get(key)
        if i is None or not self._usable(self._stderr[i]):
            return None
        return Attributed(self._rates[i], self._support[i], self._stderr[i])

    def estimates(self) -> dict[str, Attributed | None]:
        """Every key's estimate (None where too uncertain), for export."""
        return {k: self.estimate(k) for k in self._keys}

    def support(self, key: str) -> float:
        """Effective drafted tokens behind the key's rate, used or not."""
        i = self._index.get(key)
        return self._support[i] if i is not None else 0.0

    @property
    def ready(self) -> bool:
        """Some key's rate is certain enough to be used."""
        return any(self._usable(e) for e in self._stderr)

    def _usable(self, stderr: float) -> bool:
        return math.isfinite(stderr) and stderr <= self._max_stderr

    def _solve(self) -> None:
        m, b, r = self._m, self._b, self._rates
        active = [i for i in range(len(r)) if m[i][i] > 0]
        # Coordinate descent on a convex quadratic in a box: each step is the
        # exact minimum along one key, clipped; a diagonal M is solved in one sweep.
        for _ in range(_SWEEPS):
            moved = 0.0
            for i in active:
                rest = sum(m[i][j] * r[j] for j in active if j != i)
                new = min(1.0, max(0.0, (b[i] - rest) / m[i][i]))
                moved = max(moved, abs(new - r[i]))
                r[i] = new
            if moved < _CONVERGED:
                break
        # Weighted residual sum of squares, sum_w (accepted_w - r.x_w)^2 / drafted_w,
        # per degree of freedom: the noise per drafted token the windows show.
        rss = self._aa - 2 * sum(b[i] * r[i] for i in active)
        rss += sum(r[i] * m[i][j] * r[j] for i in active for j in active)
        dof = self._windows - len(active)
        variance = max(self._noise_floor, rss / dof if dof >= 1 else 0.0)
        inverse_diagonal = _inverse_diagonal([[m[i][j] for j in active] for i in active])
        self._support = [0.0] * len(r)
        self._stderr = [math.inf] * len(r)
        for i, d in zip(active, inverse_diagonal, strict=True):
            if d > 0 and math.isfinite(d):
                self._support[i] = 1.0 / d
                self._stderr[i] = math.sqrt(variance * d)


def _inverse_diagonal(a: list[list[float]]) -> list[float]:
    """Diagonal of the inverse of a small symmetric PSD matrix (Gauss-Jordan, a tiny
    ridge so that a singular one gives huge entries instead of failing)."""
    n = len(a)
    if n == 0:
        return []
    ridge = _RIDGE * max(a[i][i] for i in range(n))
    work = [[*row, *(1.0 if i == j else 0.0 for j in range(n))] for i, row in enumerate(a)]
    for i in range(n):
        work[i][i] += ridge
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(work[r][col]))
        work[col], work[pivot] = work[pivot], work[col]
        head = work[col][col]
        if head == 0:
            return [math.inf] * n
        work[col] = [v / head for v in work[col]]
        for r in range(n):
            if r != col and work[r][col] != 0:
                f = work[r][col]
                work[r] = [v - f * w for v, w in zip(work[r], work[col], strict=True)]
    return [work[i][n + i] for i in range(n)]


class DecodeLog:
    """When each request sent to one server was decoding, by key, between two scrapes.

    A request decodes from its first token (streams; `decoding`) or from when
    it was sent (`begin(..., decoding_from=at)`: a whole answer shows no first
    token, so its prefill counts as decoding). Finished intervals are kept
    until the next window is taken, at most `max_finished` of them: past that
    the window is lost (`take` returns None) rather than attributed from part
    of the requests.
    """

    __slots__ = ("_active", "_finished", "_lost", "_next")

    def __init__(self, max_finished: int = 4096) -> None:
        # handle -> (key, sequences, decoding from: None until its first token)
        self._active: dict[int, tuple[str, int, float | None]] = {}
        self._finished: deque[tuple[str, int, float, float]] = deque(maxlen=max_finished)
        self._lost = False
        self._next = 0

    def __len__(self) -> int:
        return len(self._active) + len(self._finished)

    def begin(self, key: str, sequences: int = 1, decoding_from: float | None = None) -> int:
        self._next += 1
        self._active[self._next] = (key, max(sequences, 1), decoding_from)
        return self._next

    def decoding(self, handle: int, at: float) -> None:
        """The request's first token: its sequences draft from now on."""
        entry = self._active.get(handle)
        if entry is not None and entry[2] is None:
            self._active[handle] = (entry[0], entry[1], at)

    def end(self, handle: int, at: float) -> None:
        entry = self._active.pop(handle, None)
        if entry is None or entry[2] is None:
            return  # never decoded (failed before its first token): nothing drafted
        if len(self._finished) == self._finished.maxlen:
            self._lost = True
        self._finished.append((entry[0], entry[1], entry[2], at))

    def take(self, start: float, end: float) -> dict[str, float] | None:
        """Decoding sequence-seconds per key within [start, end]; forget what ended by
        `end`. None if intervals were dropped since the last take."""
        out: dict[str, float] = {}

        def add(key: str, sequences: int, since: float, until: float) -> None:
            overlap = min(until, end) - max(since, start)
            if overlap > 0:
                out[key] = out.get(key, 0.0) + sequences * overlap

        for key, sequences, since in self._active.values():
            if since is not None:
                add(key, sequences, since, end)
        keep: deque[tuple[str, int, float, float]] = deque(maxlen=self._finished.maxlen)
        for entry in self._finished:
            add(*entry)
            if entry[3] > end:
                keep.append(entry)
        self._finished = keep
        lost, self._lost = self._lost, False
        return None if lost else out
