"""Run a module under tracemalloc; each SIGUSR1 writes a snapshot to PREFIX.0, PREFIX.1, ...

    python benchmarks/malloc_dump.py PREFIX gateway.cli ext-proc --port ...

For a leak hunt (benchmarks/extproc_soak.py --trace-malloc): tracemalloc sees
what Python's allocator hands out, not what a C library mallocs on its own (the
gRPC core does), so RSS growth that the snapshots do not show lies below Python.
"""

from __future__ import annotations

import itertools
import runpy
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

FRAMES = 4  # traceback depth per allocation: 8 slowed the picker from ~250 to 46 req/s


def main() -> None:
    prefix, module, *rest = sys.argv[1:]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.argv = [module, *rest]
    numbers = itertools.count()
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)

    def dump(signum: int, frame: FrameType | None) -> None:
        tracemalloc.take_snapshot().dump(f"{prefix}.{next(numbers)}")

    tracemalloc.start(FRAMES)
    signal.signal(signal.SIGUSR1, dump)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
