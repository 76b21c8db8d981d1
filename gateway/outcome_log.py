"""The outcome log: one JSON line per finished request, for `specroute train` and `advise`.

Written by a background thread from a bounded queue, so a slow disk never
stalls the event loop; when the queue is full, records are dropped and
counted instead. Files rotate at a size limit with a fixed number of backups,
so the log is bounded on disk too. No prompt text unless asked for.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from pathlib import Path
from typing import Any

_STOP = object()


class OutcomeLog:
    def __init__(
        self, path: Path, *, max_bytes: int, backups: int, queue_size: int = 10_000
    ) -> None:
        self.path = path
        self._max_bytes = max_bytes
        self._backups = backups
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self.dropped = 0
        self.written = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="specroute-outcome-log", daemon=True)
        self._thread.start()

    def write(self, record: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def close(self) -> None:
        """Flush what is queued and stop the writer thread."""
        self._queue.put(_STOP)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - reopened on rotation
        size = fh.tell()
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                line = json.dumps(item, separators=(",", ":")) + "\n"
                fh.write(line)
                size += len(line)
                self.written += 1
                if size >= self._max_bytes:
                    fh.close()
                    self._rotate()
                    fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
                    size = 0
                elif self._queue.empty():
                    fh.flush()
        finally:
            fh.close()

    def _rotate(self) -> None:
        for i in range(self._backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self._backups > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()
