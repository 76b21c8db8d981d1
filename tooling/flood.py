"""The chaos test's flood and its /health timer, each run as a process of its own, so
that neither the senders' 4 MB writes nor the test's event loop are timed as the
gateway's (a readiness probe, too, comes from outside the gateway's process).

    python -m tooling.flood send URL SECONDS BODY.json [BODY.json ...]
    python -m tooling.flood time URL SECONDS

`send` prints the answers' statuses as JSON; `time` prints /health round trips (ms),
one every 10 ms.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp

ROUTE_HEADER = "x-specroute-route"
JSON = {"Content-Type": "application/json"}


async def send(url: str, seconds: float, bodies: list[bytes]) -> dict[str, Counter[int]]:
    relayed: Counter[int] = Counter()  # answers a backend gave (the gateway relayed them)
    own: Counter[int] = Counter()  # answers the gateway gave itself (0: none)
    until = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def sender(body: bytes) -> None:
            while time.monotonic() < until:
                try:  # a file-like body: aiohttp writes it in chunks, as a client would
                    data = io.BytesIO(body)
                    async with session.post(url, data=data, headers=JSON) as resp:
                        await resp.read()
                        (relayed if ROUTE_HEADER in resp.headers else own)[resp.status] += 1
                except (aiohttp.ClientError, TimeoutError):
                    own[0] += 1

        await asyncio.gather(*(sender(b) for b in bodies))
    return {"relayed": relayed, "own": own}


async def time_health(url: str, seconds: float) -> list[float]:
    out: list[float] = []
    until = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < until:
            started = time.perf_counter()
            async with session.get(url) as resp:
                await resp.read()
            out.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(0.01)
    return out


def main() -> None:
    mode, url, seconds, *paths = sys.argv[1:]
    if mode == "time":
        print(json.dumps(asyncio.run(time_health(url, float(seconds)))))
        return
    bodies = [Path(p).read_bytes() for p in paths]
    counts = asyncio.run(send(url, float(seconds), bodies))
    print(json.dumps({k: dict(v) for k, v in counts.items()}))


if __name__ == "__main__":
    main()
