"""The answers being relayed right now, so that a drain can end them properly.

At the end of `server.drain_s` the answers still running are cancelled with
the DRAIN message. The proxy recognises it and ends each one as it ends any
answer that fails midway: a stream with an error event and `[DONE]`, a whole
answer not yet sent with a 503. The request is logged as drained, not as a
client that went away.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

DRAIN = "specroute-drain"


def is_drain(exc: asyncio.CancelledError) -> bool:
    return DRAIN in exc.args


class Relays:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[object]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Register the current task for as long as the block runs."""
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - the handler always runs in a task
            yield
            return
        self._tasks.add(task)
        try:
            yield
        finally:
            self._tasks.discard(task)

    def end_all(self) -> int:
        for task in self._tasks:
            task.cancel(DRAIN)
        return len(self._tasks)
