"""The outcome log: one JSON line per finished request, for `specroute train` and `advise`.

Written by a background thread from a bounded queue, so a slow disk never
stalls the event loop; when the queue is full, records are dropped and
counted instead. Files rotate at a size limit with a fixed number of backups,
so the log is bounded on disk too. No prompt text unless asked for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from gateway.outcomes.accounting import rounded
from gateway.wire.life import RequestRecord

_STOP = object()


def outcome_line(record: RequestRecord, *, include_prompt: bool) -> dict[str, Any] | None:
    """One line of the outcome log: everything `train` and `advise` learn from.

    None for a request that never got a routing decision (nothing to learn).
    """
    decision = record.decision
    if decision is None:
        return None
    features = record.features
    route = record.route or decision.route
    state = record.state
    line: dict[str, Any] = {
        "ts": round(time.time(), 3),
        "request_id": record.request_id,
        "route": route.value,
        "decided_route": decision.route.value,
        "reason": decision.reason,
        "why": dict(decision.why) if decision.why else None,
        "failover_from": record.failover_from.value if record.failover_from else None,
        "predicted_s": (
            {r.value: round(s, 6) for r, s in decision.predicted_s.items()}
            if decision.predicted_s
            else None
        ),
        "features": dataclasses.asdict(features) if features else None,
        "status": record.status,
        "http_status": record.http_status,
        "error": record.error,
        "pair": record.pair,
        "batch": record.batch,
        "waiting": state.of(route).waiting if state else None,
        "ttft_s": rounded(record.ttft_s),
        "duration_s": rounded(record.duration_s),
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "token_events": record.token_events if features and features.stream else None,
        "acceptance": rounded(record.acceptance.rate) if record.acceptance else None,
        "acceptance_length": (
            rounded(record.acceptance.mean_length) if record.acceptance else None
        ),
        "acceptance_source": record.acceptance.source if record.acceptance else None,
        "acceptance_per_step": rounded(record.acceptance.per_step) if record.acceptance else None,
    }
    prompt = record.body.get("messages", record.body.get("prompt"))
    if include_prompt and prompt is not None:
        line["prompt"] = prompt
    return line


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
