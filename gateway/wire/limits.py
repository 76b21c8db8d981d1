"""A byte-rate budget for big request bodies, so that no client can take the gateway.

Reading, parsing and forwarding a 4 MB body costs the gateway ~15 ms of CPU; two
clients posting them as fast as they can kept a 2-core host busy enough to slow
/health to tens of ms. Big bodies draw from a token bucket of
`server.big_body_mb_s`: past it, the next one waits before its body is read,
so the sender waits in TCP's flow control. Legitimate long prompts (a
100k-token prompt is ~0.4 MB) stay far below any sensible rate, since no GPU
prefills them faster.
"""

from __future__ import annotations

import asyncio
import time


class ByteRate:
    """A token bucket in bytes: `rate` per second, bursts up to one second's worth."""

    def __init__(self, rate_bytes_s: float) -> None:
        self._rate = rate_bytes_s
        self._tokens = rate_bytes_s
        self._at = time.monotonic()
        self._lock = asyncio.Lock()  # first come, first served

    async def take(self, size: int) -> None:
        async with self._lock:
            now = time.monotonic()
            self._tokens = min(self._rate, self._tokens + (now - self._at) * self._rate)
            self._at = now
            self._tokens -= size
            if self._tokens < 0:
                await asyncio.sleep(-self._tokens / self._rate)
