"""What one client may cost the gateway: a byte-rate budget for big request bodies, and
a send timeout for an answer it does not read.

Send timeout: aiohttp's write returns at once while the bytes the socket has not taken
stay under asyncio's high-water mark (64 KiB), and past it waits until the client has
read them down to the low one (16 KiB). A client that stops reading makes that wait
endless, and with it the backend's slot and its generation (nginx's send_timeout and
Envoy's stream idle timeout bound the same wait). So each write gets
`server.send_timeout_s` to make progress; past it the proxy hangs up. A client that keeps
up with a generation never waits; one that takes under 48 KiB in 30 s is cut.

Byte rate: reading, parsing and forwarding a 4 MB body costs the gateway ~15 ms of CPU; two
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
from collections.abc import Awaitable

from aiohttp import web


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


class ClientStuck(Exception):
    """A write to the client made no progress for server.send_timeout_s."""


async def send_within(write: Awaitable[object], timeout_s: float) -> None:
    """Await one write to the client (a write or write_eof); raise ClientStuck when it
    waits on the client for more than timeout_s."""
    try:
        async with asyncio.timeout(timeout_s):
            await write
    except TimeoutError:
        raise ClientStuck from None


def hang_up(request: web.Request) -> None:
    """Drop a stuck client's connection now: what it did not read is thrown away, and
    aiohttp's own end of the response has nothing left to wait on."""
    if request.transport is not None:
        request.transport.abort()
