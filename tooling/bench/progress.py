"""Progress on stderr: a live bar on a terminal, one line per finished run in a log.

A bench can take minutes; a person watching wants to see it move and when it
will end, a CI log wants one readable line per run rather than thousands of
carriage returns. Both come from tqdm: on a terminal, one bar over the whole
bench (the run in progress as its description, requests done of all, the rate
and the time left); in a log, each finished run's line ends with the same
figures for the whole bench, formatted by tqdm's own meter.
"""

from __future__ import annotations

import sys
import time
from typing import Never, TextIO

from tqdm import tqdm

from tooling.loadgen import Result

# the whole bench, after each finished run in a log: "36/144 req, 12.1 req/s, 00:09 left"
_LOG_METER = "{n_fmt}/{total_fmt} req, {rate_fmt}, {remaining} left"
_LOG_METER_OPEN = "{n_fmt} req, {rate_fmt}"  # --duration: the count is what fits in the time


class Progress:
    def __init__(self, total: int, *, tag: str = "bench", stream: TextIO | None = None) -> None:
        """total: requests over every run, or 0 when unknown (--duration)."""
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.total, self.done_all, self.tag = total, 0, tag
        self.label, self.run_total, self.done, self.failed = "", 0, 0, 0
        self._began = self._started = 0.0
        self._bar: tqdm[Never] | None = None

    def start(self, label: str, run_total: int) -> None:
        self.label, self.run_total, self.done, self.failed = label, run_total, 0, 0
        self._started = time.perf_counter()
        if not self._began:
            self._began = self._started
        if self.live:
            bar = self._bar
            if bar is None:
                bar = self._bar = tqdm(
                    total=self.total or None,
                    file=self.stream,
                    unit="req",
                    dynamic_ncols=True,
                    mininterval=0.1,
                    smoothing=0.1,
                )
            bar.set_description(f"[{self.tag}] {label}")

    def tick(self, result: Result) -> None:
        self.done += 1
        self.done_all += 1
        self.failed += not result.ok
        if self._bar is not None:
            self._bar.update(1)

    def finish(self) -> None:
        now = time.perf_counter()
        line = (
            f"[{self.tag}] {self.label}: {self.done - self.failed}/{self.done} ok"
            f"{f', {self.failed} FAILED' if self.failed else ''} in {now - self._started:.1f} s"
        )
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
            return
        meter = tqdm.format_meter(
            self.done_all,
            self.total,
            now - self._began,
            unit=" req",
            bar_format=_LOG_METER if self.total else _LOG_METER_OPEN,
        )
        self.stream.write(f"{line}; the bench: {meter}\n")
        self.stream.flush()

    def close(self) -> None:
        """The end of the bench: the terminal's bar goes, with its last figures."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
