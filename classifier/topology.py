"""Do the two servers share a GPU? Measured, not taken on trust.

On one GPU the servers take turns: while the other server is busy, each of a
server's steps waits for one of the other's. On separate GPUs they do not
notice each other. The cleanest test is a request alone on its server while
the other server runs a batch: the latency model predicts it both ways (alone;
waiting for the other's steps, which at a batch of 2 or more is 1.3x or more
slower) and the measured time says which hypothesis it follows, as a fraction
f of the way from "alone" (0) to "shared" (1) on a log scale.

Under load a gateway that assumes one GPU keeps the batch on one server and
so never meets that case; until it knows, it probes: now and then one request
goes to the idle server while the batch runs. A few probes decide.

Pure and deterministic, like the rest of classifier/.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

__all__ = ["TopologyDetector"]

_FIRST_LOOK = 5  # samples for a clear verdict (each a request alone beside a busy batch)
_KEEP = 9  # ... and for a verdict either way
_CLEAR = 0.3  # |median f| at least this after the first look decides at once
_DISTINCT = 1.3  # the two hypotheses must differ at least this much to test them
_PROBE_EVERY = 25  # decisions under load between probes, while undecided
# In the simulation of the emulator's costs (tests/classifier/shared_gpu_sim.py,
# 3 seeds) probes measured f of 0.6 to 1.4 on one GPU at concurrency 8 and -0.4
# to 0.8 at 32 (neighbours' prefills blur it), and -1.6 to 0.0 with a GPU each
# (the model predicts a request alone on a quiet server a little slow until it
# has seen some); over HTTP, CPU contention adds outliers of either sign. A clear
# median decides after 5 probes; otherwise 9 decide by the sign.


class TopologyDetector:
    """`shared` is the setting (True/False) or, with "auto", what was measured."""

    __slots__ = ("_fractions", "_pending", "_since_probe", "_verdict", "probes")

    def __init__(self, setting: bool | str) -> None:
        if setting not in (True, False, "auto"):
            raise ValueError(f"shared_gpu must be true, false or 'auto', not {setting!r}")
        self._verdict: bool | None = setting if isinstance(setting, bool) else None
        self._fractions: deque[float] = deque(maxlen=_KEEP)
        self._since_probe = 0
        self._pending = 0  # probes sent whose answer has not been seen yet
        self.probes = 0

    @property
    def shared(self) -> bool | None:
        """True: one GPU; False: a GPU each; None: not measured yet."""
        return self._verdict

    @property
    def measuring(self) -> bool:
        return self._verdict is None

    def evidence(self) -> float | None:
        """Median f over the samples so far: 0 alone, 1 shared (None: none yet)."""
        return statistics.median(self._fractions) if self._fractions else None

    def observe(self, took_s: float, alone_s: float, shared_s: float) -> None:
        """A request that ran alone on its server while the other ran a batch: its
        measured time, and the model's prediction alone and waiting for the other."""
        if not self.measuring or not (took_s > 0 and alone_s > 0) or self._pending <= 0:
            return  # only probes count: a request found alone by chance (a drain's last)
        self._pending -= 1  # ran only part of its life beside the batch
        if not shared_s >= _DISTINCT * alone_s:
            return  # the other's steps are too small next to its own to tell
        f = math.log(took_s / alone_s) / math.log(shared_s / alone_s)
        self._fractions.append(f)
        seen, median = len(self._fractions), statistics.median(self._fractions)
        if seen >= _KEEP or (seen >= _FIRST_LOOK and abs(median) >= _CLEAR):
            self._verdict = median >= 0

    def probe_now(self) -> bool:
        """Called once per decision under load while measuring: send this one across?"""
        if not self.measuring:
            return False
        self._since_probe += 1
        if self._since_probe < _PROBE_EVERY:
            return False
        self._since_probe = 0
        self.probes += 1
        self._pending += 1
        return True
