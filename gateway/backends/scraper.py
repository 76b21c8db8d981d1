"""Scrape each backend's vLLM /metrics on an interval: load and acceptance.

The router reads the result (a snapshot) without waiting: a slow or dead
scrape only makes the snapshot stale (and then ignored), it never blocks a
request. Only the handful of series the gateway uses are read, by a line
filter rather than a full exposition parser, because vLLM's /metrics is large
(hundreds of histogram lines) and this runs every few seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

import aiohttp

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
# When the counter was created: it changes when vLLM restarts, even where the
# new counters have already climbed past the old values by the next scrape.
DRAFT_TOKENS_CREATED = "vllm:spec_decode_num_draft_tokens_created"
_WANTED = (RUNNING, WAITING, KV_USAGE, DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS, DRAFT_TOKENS_CREATED)


@dataclass(frozen=True, slots=True)
class Scrape:
    """One backend endpoint's figures at one moment (sums over engines)."""

    at: float
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    counters_created: float | None = None  # sum over engines: any restart changes it


@dataclass(frozen=True, slots=True)
class Acceptance:
    """Acceptance over the window between two scrapes (vLLM's own counters)."""

    rate: float  # accepted / drafted tokens
    mean_length: float  # 1 + accepted per draft: tokens per verify step
    draft_tokens: float


def parse_metrics(text: str, at: float) -> Scrape:
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name, value = _name_and_value(line)
        if name in _WANTED and value is not None:
            if name == KV_USAGE:  # a ratio: several engines -> the fullest
                sums[name] = max(sums.get(name, 0.0), value)
            else:
                sums[name] = sums.get(name, 0.0) + value
    return Scrape(
        at=at,
        running=sums.get(RUNNING),
        waiting=sums.get(WAITING),
        kv_usage=sums.get(KV_USAGE),
        drafts=sums.get(DRAFTS),
        draft_tokens=sums.get(DRAFT_TOKENS),
        accepted_tokens=sums.get(ACCEPTED_TOKENS),
        counters_created=sums.get(DRAFT_TOKENS_CREATED),
    )


@dataclass(frozen=True, slots=True)
class CounterWindow:
    """The speculative counters' deltas between two scrapes of one server."""

    start: float  # monotonic times of the two scrapes
    end: float
    drafts: float
    draft_tokens: float
    accepted_tokens: float


def counter_window(before: Scrape, after: Scrape) -> CounterWindow | str:
    """The deltas, or why there are none: "no_counters" (a server without
    speculative decoding), "reset" (a restart: counters went down, accepted
    outgrew drafted, or the counters were created anew), "no_drafts"."""
    b_drafted, a_drafted = before.draft_tokens, after.draft_tokens
    b_accepted, a_accepted = before.accepted_tokens, after.accepted_tokens
    if b_drafted is None or a_drafted is None or b_accepted is None or a_accepted is None:
        return "no_counters"
    drafted, accepted = a_drafted - b_drafted, a_accepted - b_accepted
    if (
        drafted < 0
        or accepted < 0
        or accepted > drafted
        or before.counters_created != after.counters_created
    ):
        return "reset"
    if drafted == 0:
        return "no_drafts"
    drafts = (after.drafts or 0.0) - (before.drafts or 0.0)
    return CounterWindow(before.at, after.at, max(drafts, 0.0), drafted, accepted)


def acceptance_between(before: Scrape, after: Scrape) -> Acceptance | None:
    """d(accepted)/d(drafted); None without new drafts (or after a restart)."""
    window = counter_window(before, after)
    if isinstance(window, str):
        return None
    drafted, accepted, drafts = window.draft_tokens, window.accepted_tokens, window.drafts
    mean_length = 1.0 + accepted / drafts if drafts > 0 else float("nan")
    return Acceptance(rate=accepted / drafted, mean_length=mean_length, draft_tokens=drafted)


def _name_and_value(line: str) -> tuple[str, float | None]:
    """`name{labels} value [timestamp]` -> (name, value); label values may hold spaces."""
    if "{" in line:
        name, tail = line[: line.index("{")], line[line.rindex("}") + 1 :]
    else:
        name, _, tail = line.partition(" ")
    try:
        return name, float(tail.split()[0])
    except (ValueError, IndexError):
        return name, None


async def scrape_once(
    session: aiohttp.ClientSession, base_url: str, headers: dict[str, str], timeout_s: float
) -> Scrape | None:
    try:
        async with session.get(
            f"{base_url}/metrics", headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            if resp.status != 200:
                return None
            text = await resp.text()
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return None
    return parse_metrics(text, time.monotonic())


def fresh(scrapes: Iterable[Scrape | None], max_age_s: float) -> list[Scrape]:
    now = time.monotonic()
    return [s for s in scrapes if s is not None and now - s.at <= max_age_s]


async def sleep_until_next(interval_s: float, started: float) -> None:
    await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))
