"""Real vLLM on 2 CPU cores: does a server answer while its neighbour is busy?

    .venv/bin/python benchmarks/real_stall.py --start --k2-bind 1   # pinned beside none (default)
    .venv/bin/python benchmarks/real_stall.py --start --k2-bind nobind  # unpinned
    .venv/bin/python benchmarks/real_stall.py --probe URL --busy URL

Why: the three-route tier failed in CI (2026-12-06) when the ngram-k2 server,
pinned to the baseline's core, took the gateway profile's step probe while the
baseline was kept busy: the probe got no answer, and vLLM's engine died 300 s
later (execute_model timed out). Each round here does what that profile step
does: a step probe to the probed server alone (the profile's: a 4-token prompt,
24 tokens, greedy, streamed), then the busy server takes a batch of four long
streams and ~300-token prompts one after another, and 0.3 s later the probe
again. A probe with no answer in --stall-s is a stall: the load stops, the
script waits --stall-s more, then sends the probed server one more request and
says whether that released the stalled one (a request that sat unseen until the
next arrived) or not (a wedged engine). REAL figures; the servers' logs say
what vLLM saw ("Running: 0 reqs, Waiting: 0 reqs" while a request was open).

--start runs deploy/cpu/up.sh --ngram-k2 --ngram-k2-bind BIND in its own run dir
(probe: ngram-k2, busy: the baseline) and stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tooling.cpu_trio import start_trio, stop_trio  # noqa: E402

MODEL = "smollm2-135m"
STEP: dict[str, Any] = {  # the profile's step probe (gateway/profiling/probes.py)
    "prompt": "Once upon a time",
    "max_tokens": 24,
    "min_tokens": 24,
    "ignore_eos": True,
    "temperature": 0,
    "stream": True,
}
LONG = {**STEP, "max_tokens": 96, "min_tokens": 96}
FILLER = " ".join(["the committee reviews the quarterly report before the vote"] * 30)[:1600]


async def stream(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> float:
    """Seconds until a streamed completion ends."""
    started = time.perf_counter()
    async with http.post(f"{url}/v1/completions", json={"model": MODEL, **body}) as r:
        r.raise_for_status()
        async for _ in r.content:
            pass
    return time.perf_counter() - started


async def prompts(http: aiohttp.ClientSession, url: str) -> None:
    """Prompts one after another until cancelled; each its own, so no prefix-cache hit."""
    while True:
        text = f"[{secrets.token_hex(4)}] {FILLER}\nReply with one word."
        body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 2}
        try:
            async with http.post(f"{url}/v1/chat/completions", json=body) as r:
                await r.read()
        except aiohttp.ClientError:
            await asyncio.sleep(0.05)


async def one_round(
    http: aiohttp.ClientSession, probe: str, busy: str, stall_s: float
) -> tuple[float, float | None, str]:
    """(alone s, beside s or None for a stall, what happened to a stalled probe)."""
    alone = await stream(http, probe, STEP)
    load: list[asyncio.Future[Any]] = [
        asyncio.ensure_future(stream(http, busy, LONG)) for _ in range(4)
    ]
    load.append(asyncio.ensure_future(prompts(http, busy)))
    await asyncio.sleep(0.3)
    beside = asyncio.ensure_future(stream(http, probe, STEP))
    done, _ = await asyncio.wait([beside], timeout=stall_s)
    for task in load:
        task.cancel()
    await asyncio.gather(*load, return_exceptions=True)
    if done:
        return alone, beside.result(), ""
    done, _ = await asyncio.wait([beside], timeout=stall_s)
    if done:
        return alone, None, "answered once the load stopped"
    try:
        kick = await asyncio.wait_for(stream(http, probe, STEP), timeout=stall_s)
    except (TimeoutError, aiohttp.ClientError) as exc:
        beside.cancel()
        return alone, None, f"wedged: a new request failed too ({type(exc).__name__})"
    done, _ = await asyncio.wait([beside], timeout=1.0)
    beside.cancel()
    if done:
        return alone, None, f"released by the next request (answered in {kick:.2f} s)"
    return alone, None, f"still open; the next request answered in {kick:.2f} s"


async def measure(probe: str, busy: str, rounds: int, stall_s: float) -> int:
    print(f"REAL vLLM: probe {probe}, busy neighbour {busy}, {rounds} rounds, stall at {stall_s} s")
    alone: list[float] = []
    beside: list[float] = []
    stalls = 0
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await stream(http, probe, STEP)  # warm both
        await stream(http, busy, STEP)
        for i in range(rounds):
            a, b, note = await one_round(http, probe, busy, stall_s)
            alone.append(a)
            if b is None:
                stalls += 1
                print(f"round {i + 1}: alone {a:.2f} s, beside: STALL, {note}", flush=True)
                if note.startswith("wedged"):
                    break
            else:
                beside.append(b)
                print(f"round {i + 1}: alone {a:.2f} s, beside {b:.2f} s", flush=True)
    med = statistics.median
    print(
        f"rounds {len(alone)}, stalls {stalls}; median probe alone {med(alone):.2f} s, "
        f"beside {med(beside):.2f} s"
        if beside
        else f"rounds {len(alone)}, stalls {stalls}"
    )
    return stalls


def main(args: argparse.Namespace) -> int:
    if not args.start:
        if not (args.probe and args.busy):
            raise SystemExit("real_stall: pass --probe URL --busy URL, or --start")
        asyncio.run(measure(args.probe, args.busy, args.rounds, args.stall_s))
        return 0
    run_dir = Path(tempfile.mkdtemp(prefix="specroute-real-stall-"))
    try:
        urls = start_trio(run_dir, "--ngram-k2-bind", args.k2_bind)
        print(f"ngram-k2 bind: {args.k2_bind}; logs in {run_dir}")
        asyncio.run(measure(urls["ngram-k2"], urls["none"], args.rounds, args.stall_s))
    finally:
        stop_trio(run_dir)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--start", action="store_true", help="start (and stop) the trio")
    p.add_argument("--k2-bind", default="1", help="ngram-k2's core, or nobind (--start)")
    p.add_argument("--probe", help="the probed server's URL (without --start)")
    p.add_argument("--busy", help="the busy neighbour's URL (without --start)")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--stall-s", type=float, default=15.0)
    sys.exit(main(p.parse_args()))
