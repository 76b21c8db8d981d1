"""Progress on stderr: a live bar on a terminal, one line per finished run in a log.

A bench can take minutes; a person watching wants to see it move, a CI log
wants one readable line per run rather than thousands of carriage returns.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tooling.loadgen import Result

_WIDTH = 24


class Progress:
    def __init__(self, total: int, *, tag: str = "bench", stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.total, self.done_all, self.tag = total, 0, tag
        self.label, self.run_total, self.done, self.failed = "", 0, 0, 0
        self._started = self._last = 0.0

    def start(self, label: str, run_total: int) -> None:
        self.label, self.run_total, self.done, self.failed = label, run_total, 0, 0
        self._started = time.perf_counter()
        self._show()

    def tick(self, result: Result) -> None:
        self.done += 1
        self.done_all += 1
        self.failed += not result.ok
        now = time.perf_counter()
        if now - self._last >= 0.1 or self.done == self.run_total:
            self._last = now
            self._show()

    def finish(self) -> None:
        elapsed = time.perf_counter() - self._started
        if self.live:
            self.stream.write("\r\x1b[2K")
        self.stream.write(
            f"[{self.tag}] {self.label}: {self.done - self.failed}/{self.done} ok"
            f"{f', {self.failed} FAILED' if self.failed else ''} in {elapsed:.1f} s\n"
        )
        self.stream.flush()

    def _show(self) -> None:
        if not self.live:
            return
        if self.run_total:  # a known count: a bar
            bar = "#" * int(self.done / self.run_total * _WIDTH)
            where = f"[{bar:<{_WIDTH}}] {self.done}/{self.run_total}"
            where += f"  (all {self.done_all}/{self.total})"
        else:  # --duration: the count is whatever fits in the time
            where = f"{self.done} done, {time.perf_counter() - self._started:.0f} s"
        self.stream.write(f"\r\x1b[2K[{self.tag}] {self.label:<34} {where}")
        self.stream.flush()
