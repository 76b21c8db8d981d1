"""Scrape each backend's vLLM /metrics on an interval: load and acceptance.

The router reads the result (a snapshot) without waiting: a slow or dead
scrape only makes the snapshot stale (and then ignored), it never blocks a
request. Only the handful of series the gateway uses are read, by a line
filter rather than a full exposition parser, because vLLM's /metrics is large
(hundreds of histogram lines) and this runs every few seconds.

A backend is not trusted: its body is read up to a bound, no line of it can make
the parser raise, and a figure that is not finite, negative or out of its range
is unknown (never a 500 downstream), with its fault counted by kind.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import aiohttp
import structlog

log = structlog.get_logger("specroute.backends")

# Like Prometheus's body_size_limit: a real vLLM's /metrics is about 60 KB
# (deploy/cpu/fixtures/metrics_*.txt); a body past this is dropped unread.
MAX_BODY_BYTES = 16 * 2**20
_CHUNK_BYTES = 64 * 2**10
MAX_REQUESTS = 1e6  # running or waiting on one server: more is no real figure

# Why a scrape, or one figure of it, was thrown away
# (specroute_scrape_errors_total's `kind`): a fixed set.
NON_FINITE = "non_finite"  # NaN, +Inf or -Inf, or a sum over engines that overflowed
NEGATIVE = "negative"
OUT_OF_RANGE = "out_of_range"  # running/waiting over MAX_REQUESTS, KV usage over 1
MALFORMED = "malformed"  # a line of a series read that does not parse, or bad HTTP
TOO_LARGE = "too_large"  # a body over MAX_BODY_BYTES
HTTP_STATUS = "http_status"  # an answer other than 200
UNREACHABLE = "unreachable"  # no connection, or it broke
TIMEOUT = "timeout"  # no whole answer within the scrape timeout
SCRAPE_ERRORS = (
    NON_FINITE,
    NEGATIVE,
    OUT_OF_RANGE,
    MALFORMED,
    TOO_LARGE,
    HTTP_STATUS,
    UNREACHABLE,
    TIMEOUT,
)

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
# Every figure is finite and >= 0; these also have a ceiling (vLLM's KV usage is a fraction).
_CEILINGS = {RUNNING: MAX_REQUESTS, WAITING: MAX_REQUESTS, KV_USAGE: 1.0}


@dataclass(frozen=True, slots=True)
class Scrape:
    """One backend endpoint's figures at one moment (sums over engines). Each is
    finite, >= 0 and within its ceiling, or None: absent, or thrown away."""

    at: float
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    counters_created: float | None = None  # sum over engines: any restart changes it
    problems: tuple[str, ...] = ()  # the fault of each figure thrown away (SCRAPE_ERRORS)


@dataclass(frozen=True, slots=True)
class Acceptance:
    """Acceptance over the window between two scrapes (vLLM's own counters)."""

    rate: float  # accepted / drafted tokens
    mean_length: float  # 1 + accepted per draft: tokens per verify step
    draft_tokens: float


def parse_metrics(text: str, at: float) -> Scrape:
    """The figures the gateway reads; a figure with any bad sample is unknown, and
    its first fault is in `problems`. Never raises, whatever the text."""
    sums: dict[str, float] = {}
    problems: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name, tail = _name_and_tail(line)
        if name not in _WANTED or name in problems:
            continue
        value = _checked(name, tail)
        if isinstance(value, str):
            problems[name] = value
        elif name == KV_USAGE:  # a ratio: several engines -> the fullest
            sums[name] = max(sums.get(name, 0.0), value)
        else:
            sums[name] = sums.get(name, 0.0) + value
    for name, total in sums.items():  # a sum over engines can pass a ceiling, or overflow
        if name not in problems and (fault := check(name, total)):
            problems[name] = fault
    known = {name: total for name, total in sums.items() if name not in problems}
    return Scrape(
        at=at,
        running=known.get(RUNNING),
        waiting=known.get(WAITING),
        kv_usage=known.get(KV_USAGE),
        drafts=known.get(DRAFTS),
        draft_tokens=known.get(DRAFT_TOKENS),
        accepted_tokens=known.get(ACCEPTED_TOKENS),
        counters_created=known.get(DRAFT_TOKENS_CREATED),
        problems=tuple(problems.values()),
    )


def check(name: str, value: float) -> str | None:
    """Why `value` is no figure for the series `name` (a SCRAPE_ERRORS kind), or None."""
    if not math.isfinite(value):
        return NON_FINITE
    if value < 0:
        return NEGATIVE
    if value > _CEILINGS.get(name, math.inf):
        return OUT_OF_RANGE
    return None


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


def _name_and_tail(line: str) -> tuple[str, str | None]:
    """`name{labels} value [timestamp]` -> (name, "value [timestamp]"); label values
    may hold spaces. The tail is None where a `{` is never closed."""
    opened = line.find("{")
    if opened < 0:
        name, _, tail = line.partition(" ")
        return name, tail
    closed = line.rfind("}")
    return line[:opened], line[closed + 1 :] if closed > opened else None


def _checked(name: str, tail: str | None) -> float | str:
    """The sample's value, or its fault (a SCRAPE_ERRORS kind)."""
    words = tail.split() if tail is not None else []
    try:
        value = float(words[0])
    except (ValueError, IndexError):
        return MALFORMED
    return check(name, value) or value


async def scrape_once(
    session: aiohttp.ClientSession, base_url: str, headers: dict[str, str], timeout_s: float
) -> Scrape | str:
    """One scrape of a server's /metrics, or why there is none (a SCRAPE_ERRORS kind)."""
    try:
        async with session.get(
            f"{base_url}/metrics", headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            if resp.status != 200:
                return HTTP_STATUS
            body = await read_limited(resp, MAX_BODY_BYTES)
    except TimeoutError:  # before ClientConnectionError: aiohttp's timeouts are both
        return TIMEOUT
    except aiohttp.ClientConnectionError:
        return UNREACHABLE
    except aiohttp.ClientError:  # an answer no HTTP parser takes
        return MALFORMED
    if body is None:
        return TOO_LARGE
    return parse_metrics(body.decode("utf-8", "replace"), time.monotonic())


async def read_limited(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes | None:
    """The body, or None once it passes max_bytes: the rest is never read (the
    connection is closed), so a body without end costs max_bytes of memory at most."""
    if resp.content_length is not None and resp.content_length > max_bytes:
        resp.close()
        return None
    body = bytearray()
    async for chunk in resp.content.iter_chunked(_CHUNK_BYTES):
        body += chunk
        if len(body) > max_bytes:
            resp.close()
            return None
    return bytes(body)


async def supervised(run: Callable[[], Awaitable[None]], backoff_s: float, **fields: str) -> None:
    """Run `run` for ever: if it raises, one log line with the exception, and it starts
    again after backoff_s. A background task that raised used to die unseen (its
    traceback came at shutdown), taking load-aware routing with it until a restart."""
    while True:
        try:
            await run()
        except Exception:
            log.exception("background_task_failed", restart_in_s=backoff_s, **fields)
        await asyncio.sleep(backoff_s)


def fresh(scrapes: Iterable[Scrape | None], max_age_s: float) -> list[Scrape]:
    now = time.monotonic()
    return [s for s in scrapes if s is not None and now - s.at <= max_age_s]


async def sleep_until_next(interval_s: float, started: float) -> None:
    await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))
