"""The outcome log: one JSON line per finished request, for `specroute train` and `advise`.

Written by a background thread from a bounded queue, so a slow disk never
stalls the event loop; when the queue is full, records are dropped and
counted instead. Files rotate at a size limit with a fixed number of backups,
so the log is bounded on disk too. No prompt text unless asked for.

Nothing the writer meets ends it or goes unsaid: a record JSON cannot hold (nested
past the recursion limit, a non-finite number) is skipped, a write that fails (a
full disk, a removed directory) loses its line and the writer tries the next; each
is counted (specroute_outcome_log_dropped_total{reason}) and logged once per
streak. close() gives the writer CLOSE_S, then drops what is left, so a stuck
disk never holds a SIGTERM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import json
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import structlog

from gateway.files import not_regular
from gateway.outcomes.accounting import rounded
from gateway.telemetry import Metrics
from gateway.wire.life import RequestRecord

log = structlog.get_logger("specroute.outcome_log")

_STOP = object()
CLOSE_S = 5.0  # close(): the writer's time for what is queued; the rest is dropped
_WATCH_S = 1.0  # how often the writer checks that the path is still the file it holds
DROP_REASONS = ("queue_full", "unserializable", "write_failed", "shutdown")
_UNSERIALIZABLE = (ValueError, TypeError, RecursionError, OverflowError)


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
    """A JSONL file written by a thread of its own from a bounded queue; `name` labels
    its metrics (outcomes, shadows)."""

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int,
        backups: int,
        queue_size: int = 10_000,
        metrics: Metrics | None = None,
        name: str = "outcomes",
    ) -> None:
        self.path, self.name = path, name
        self._max_bytes = max_bytes
        self._backups = backups
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._metrics = metrics
        if metrics is not None:  # every series from the start, at 0
            metrics.outcome_log_write_failures.labels(name)
            for reason in DROP_REASONS:
                metrics.outcome_log_dropped.labels(name, reason)
        self.dropped = 0  # every reason
        self.written = 0
        self.write_failures = 0
        self._count_lock = threading.Lock()  # `dropped`: the loop, the writer, close()
        self._closing = False
        self._abandon = threading.Event()
        self._queue_full = self._failing = self._skipping = False  # streaks: one line each
        self._lost_in_streak = 0
        self._fh: io.FileIO | None = None
        self._size = 0
        self._identity = (0, 0)  # (st_dev, st_ino) of the file held
        self._checked_at = 0.0
        self._torn = False  # a line was cut short: the next starts on a new line
        self._thread = threading.Thread(target=self._run, name="specroute-outcome-log", daemon=True)
        self._thread.start()

    def write(self, record: dict[str, Any]) -> None:
        """Queue one line; never blocks: a full queue (a slow or stuck disk) drops it."""
        if self._closing:
            self._drop("shutdown")
            return
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self._drop("queue_full")
            if not self._queue_full:
                log.warning("outcome_log_queue_full", log=self.name, path=str(self.path))
            self._queue_full = True
        else:
            self._queue_full = False

    def close(self, timeout_s: float = CLOSE_S) -> None:
        """Write what is queued, for timeout_s at most; then drop the rest, counted and
        logged, and leave a writer stuck in a write behind (a daemon thread)."""
        self._closing = True
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout_s)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if not self._thread.is_alive():
            return
        self._abandon.set()
        left = 0
        with contextlib.suppress(queue.Empty):
            while True:
                left += self._queue.get_nowait() is not _STOP
        self._drop("shutdown", left)
        self._queue.put_nowait(_STOP)  # room now: a writer that comes back stops
        log.warning("outcome_log_abandoned", log=self.name, path=str(self.path), dropped=left)

    def _run(self) -> None:
        """Never ends on an exception: a line that fails is counted, the next tried."""
        with contextlib.suppress(OSError):  # else the first open says why
            self.path.parent.mkdir(parents=True, exist_ok=True)
        while not self._abandon.is_set() and (item := self._queue.get()) is not _STOP:
            if self._abandon.is_set():
                self._drop("shutdown")
                break
            try:
                self._write(item)
            except Exception as exc:  # a gap in the handling below: the line, not the thread
                self._drop("write_failed")
                self._failed(exc)
        self._close_file()

    def _write(self, item: object) -> None:
        try:
            line = (json.dumps(item, separators=(",", ":"), allow_nan=False) + "\n").encode()
        except _UNSERIALIZABLE as exc:
            self._drop("unserializable")
            if not self._skipping:
                log.warning("outcome_log_line_skipped", log=self.name, error=_said(exc))
            self._skipping = True
            return
        self._skipping = False
        try:
            self._append(line)
        except OSError as exc:
            self._close_file()
            self._drop("write_failed")
            self._failed(exc)
            return
        self.written += 1
        if self._failing:
            log.info("outcome_log_writing_again", log=self.name, lost=self._lost_in_streak)
            self._failing, self._lost_in_streak = False, 0
        if self._size >= self._max_bytes:
            self._close_file()
            try:
                self._rotate()
            except OSError as exc:  # the line is written; the next one reopens the path
                self._failed(exc)

    def _append(self, line: bytes) -> None:
        fh = self._file()
        data = b"\n" + line if self._torn else line
        sent = 0
        try:
            while sent < len(data):
                n = fh.write(data[sent:])
                if not n:
                    raise OSError(errno.EAGAIN, "the file took no bytes")
                sent += n
        finally:
            self._torn = self._torn if sent == 0 else sent < len(data)
            self._size += sent

    def _file(self) -> io.FileIO:
        """The file held, reopened when the path no longer names it (rotated away by
        another process, or its directory removed: then the open fails, and says so)."""
        now = time.monotonic()
        if self._fh is not None and now - self._checked_at >= _WATCH_S:
            self._checked_at = now
            try:
                info = os.stat(self.path)
                held = (info.st_dev, info.st_ino) == self._identity
            except OSError:
                held = False
            if not held:
                self._close_file()
        if self._fh is None:
            fh = self._open_file()
            info = os.fstat(fh.fileno())
            self._fh, self._size, self._checked_at = fh, info.st_size, now
            self._identity = (info.st_dev, info.st_ino)
        return self._fh

    def _open_file(self) -> io.FileIO:
        """The path opened to append, unbuffered (a failed write loses its own line, not
        a buffer's); never a FIFO (the open would wait for a reader) or a device."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(self.path, flags, 0o644)
        if why := not_regular(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, why)
        return open(fd, "ab", buffering=0)

    def _close_file(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None

    def _drop(self, reason: str, lines: int = 1) -> None:
        if lines <= 0:
            return
        with self._count_lock:
            self.dropped += lines
        if reason == "write_failed":
            self._lost_in_streak += lines
        if self._metrics is not None:
            self._metrics.outcome_log_dropped.labels(self.name, reason).inc(lines)

    def _failed(self, exc: Exception) -> None:
        """A write, open or rotation that failed: counted each time, logged once a streak."""
        self.write_failures += 1
        if self._metrics is not None:
            self._metrics.outcome_log_write_failures.labels(self.name).inc()
        if not self._failing:
            log.warning(
                "outcome_log_write_failed", log=self.name, path=str(self.path), error=_said(exc)
            )
        self._failing = True

    def _rotate(self) -> None:
        for i in range(self._backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self._backups > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()


def _said(exc: BaseException) -> str:
    """One short line: an OSError's own words, else the exception's (never the record)."""
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return " ".join(f"{type(exc).__name__}: {text}".split())[:200]
