"""Timing several targets (servers, gateways) on the same requests, one after another.

An interleaved comparison on a real engine is fair only when every target starts equal:
the prompt already in every server's prefix cache (`prime`), and before each send no
server running or queueing anything, no gateway holding a shadow copy, and each gateway's
view of the servers a scrape taken now (`idle`; its last periodic scrape, every 2 s,
could still show the timer's own direct requests of a moment before as other clients'
load). The real-vLLM tier's routing tests and benchmarks/real_routes.py share these.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from gateway.backends.scraper import parse_metrics
from gateway.state import BACKENDS, CONFIG, SESSION, SHADOWS

Body = dict[str, Any]


def mix(
    workloads: Mapping[str, Callable[[random.Random], Body]],
    per_workload: int,
    seed: str,
    model: str,
    max_tokens: int,
) -> list[tuple[str, Body]]:
    """per_workload bodies of each workload, interleaved by workload, each for `model`
    and capped at max_tokens; the same seed gives the same bodies."""
    out = []
    for i in range(per_workload):
        for name, make in workloads.items():
            body = make(random.Random(f"{seed}:{name}:{i}"))
            body["model"] = model
            body["max_tokens"] = min(int(body.get("max_tokens", max_tokens)), max_tokens)
            out.append((name, body))
    return out


def route_tables(urls: Mapping[str, str], k: Mapping[str, int]) -> dict[str, Any]:
    """`[routes.NAME]` tables, in urls' order, for routes with one server each: n-gram
    speculation at k[NAME] tokens, or none where k[NAME] is 0."""
    tables: dict[str, Any] = {}
    for name, url in urls.items():
        table: dict[str, Any] = {"urls": [url], "method": "ngram" if k[name] else "none"}
        if k[name]:
            table["num_speculative_tokens"] = k[name]
        tables[name] = table
    return tables


async def prime(http: aiohttp.ClientSession, urls: Iterable[str], body: Body) -> dict[str, int]:
    """The body's prompt into each server's prefix cache (one token); the HTTP status per
    server."""
    statuses = {}
    for url in urls:
        async with http.post(url + "/v1/chat/completions", json={**body, "max_tokens": 1}) as r:
            await r.read()
            statuses[url] = r.status
    return statuses


async def idle(
    http: aiohttp.ClientSession,
    urls: Iterable[str],
    gateways: Sequence[web.Application],
    timeout_s: float = 120.0,
) -> bool:
    """Wait until the servers run and queue nothing and no gateway holds a shadow copy,
    then have each gateway scrape its servers now. False if that took over timeout_s."""
    urls = list(urls)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy: float = sum(app[SHADOWS].pending for app in gateways)
        for url in urls:
            async with http.get(url + "/metrics") as resp:
                scrape = parse_metrics(await resp.text(), at=0.0)
            busy += (scrape.running or 0.0) + (scrape.waiting or 0.0)
        if not busy:
            for app in gateways:
                await app[BACKENDS].forget_own_load(
                    app[SESSION], app[CONFIG].upstream.health_timeout_s
                )
            return True
        await asyncio.sleep(0.2)
    return False


@dataclass(frozen=True, slots=True)
class Answer:
    """One timed request. seconds is None when the answer was not a 200 (then error
    holds its body); route and reason are the gateway's headers ("" from a server)."""

    seconds: float | None
    status: int
    route: str
    reason: str
    error: str = ""


async def timed(
    http: aiohttp.ClientSession, url: str, body: Body, route: str | None = None
) -> Answer:
    """One chat completion's end-to-end time; `route` forces a gateway's route (the
    override header)."""
    headers = {"x-specroute-route": route} if route else None
    started = time.perf_counter()
    async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        text = await resp.text()
        took = time.perf_counter() - started
        got = resp.headers.get("x-specroute-route", "")
        reason = resp.headers.get("x-specroute-reason", "")
        if resp.status != 200:
            return Answer(None, resp.status, got, reason, text)
    return Answer(took, resp.status, got, reason)
