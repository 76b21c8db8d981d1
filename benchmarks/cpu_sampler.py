"""Run a Python module under a sampler that ticks on the process's CPU time, not the wall's.

    python benchmarks/cpu_sampler.py OUT INTERVAL_S MODULE [ARGS...]
    (then SIGUSR1: start counting; SIGUSR2: stop and write OUT)

py-spy samples a thread that is runnable whether or not it runs: on a machine whose cores
are taken by others, the gateway waits for its core for milliseconds at a time, and each
wait lands hundreds of samples on the one line it was preempted at (one run put 1,295 of
10,977 samples in a five-line validation function). SIGPROF comes every INTERVAL_S of CPU
the process used, so samples follow the CPU alone. Each sample is the main thread's stack,
written as py-spy's raw format (`func (file:line);...` root first, then a count), so
benchmarks/cpu_profile.py reads both. Time in C is put on the Python frame that called
it, or, for the event loop's own C, on the callback it runs next.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from collections import Counter
from pathlib import Path
from types import FrameType


class Sampler:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.samples: Counter[str] = Counter()
        self.on = False

    def take(self, signum: int, frame: FrameType | None) -> None:
        if not self.on:
            return
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append(f"{code.co_qualname} ({code.co_filename}:{frame.f_lineno})")
            frame = frame.f_back
        self.samples[";".join(reversed(stack))] += 1

    def start(self, signum: int, frame: FrameType | None) -> None:
        self.samples.clear()
        self.on = True

    def stop(self, signum: int, frame: FrameType | None) -> None:
        self.on = False
        lines = (f"{stack} {count}\n" for stack, count in self.samples.items())
        self.out.write_text("".join(lines))


def main() -> None:
    out, interval, module, *args = sys.argv[1:]
    sampler = Sampler(Path(out))
    signal.signal(signal.SIGPROF, sampler.take)
    signal.signal(signal.SIGUSR1, sampler.start)
    signal.signal(signal.SIGUSR2, sampler.stop)
    signal.setitimer(signal.ITIMER_PROF, float(interval), float(interval))
    sys.argv = [module, *args]
    sys.path[0] = os.getcwd()  # as `python -m` has it: the working directory's packages first
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
