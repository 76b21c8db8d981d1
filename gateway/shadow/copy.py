"""One shadow copy: what it sends, and what its answer showed (timings, never text).

A shadow repeats a finished user request on the route that was not chosen, so
that both routes are measured on the same request. To make the two comparable
it keeps the messages, the sampling parameters and the seed, and forces the
primary's answer length: vLLM's `min_tokens` (no EOS or stop string before it)
and `ignore_eos`, with `max_tokens` at the same count, make the shadow produce
exactly as many tokens as the user's answer had. The answer is read to its end
(a stream is drained) for its timing and usage, then dropped: nothing of it is
kept, returned, logged or recorded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from classifier.features import Endpoint, RequestFeatures
from classifier.types import Route
from gateway.wire.acceptance import MeasuredAcceptance, measured_acceptance
from gateway.wire.life import AttributedRate, RequestRecord
from gateway.wire.proxy import has_token, loads_object
from gateway.wire.tracing import Call, Tracing, shadow_call

_PATHS = {Endpoint.CHAT: "/v1/chat/completions", Endpoint.COMPLETIONS: "/v1/completions"}
_EVENT_END = b"\n\n"


@dataclass(frozen=True, slots=True)
class Primary:
    """The finished user request a shadow copies: only what the pair needs."""

    request_id: str
    features: RequestFeatures
    route: Route  # chosen and answered (no failover, no override)
    reason: str
    pair: int
    duration_s: float
    completion_tokens: int
    alone: bool  # nothing else ran on its GPU as it was sent and ended: comparable
    model: str | None = None
    # The trace context the user's request carried on (RequestRecord.trace): the copy's
    # trace links to it (tracing on) or carries it unchanged (off).
    trace: Mapping[str, str] = field(default_factory=dict)


def primary_of(record: RequestRecord) -> Primary | None:
    """The record as a shadow's primary, or None where no fair copy can be made: an
    answer that failed or had no token count, a forced route (override header, the
    side-by-side page), a failover (the answering route was not the choice), or n > 1
    (min_tokens counts per sequence, usage for all of them)."""
    lesson, decision = record.lesson, record.decision
    if lesson is None or decision is None or record.failover_from is not None:
        return None
    if decision.reason in ("override", "ui") or decision.route != lesson.route:
        return None
    if lesson.features.n != 1:
        return None
    return Primary(
        record.request_id,
        lesson.features,
        lesson.route,
        decision.reason,
        record.pair,
        record.duration_s,
        lesson.completion_tokens,
        alone=record.batch == 1
        and not any(
            state.inflight for route, state in lesson.state.servers.items() if route != lesson.route
        ),
        model=model if isinstance(model := record.body.get("model"), str) else None,
        trace=record.trace,
    )


def shadow_body(body: dict[str, Any], tokens: int) -> bytes:
    """The user's body with its answer length forced to `tokens`: same messages,
    sampling and seed; a stream asks for its usage (the shadow's token count).

    ValueError or RecursionError where the parser took what json cannot write back
    (1e309 would go out as Infinity, which is no JSON; a nesting json.dumps cannot
    recurse into): no copy of that request (validation.with_member says more)."""
    copy = dict(body)
    copy.pop("max_completion_tokens", None)  # vLLM prefers it to max_tokens
    copy["max_tokens"] = tokens
    copy["min_tokens"] = tokens
    copy["ignore_eos"] = True
    if copy.get("stream"):
        options = copy.get("stream_options")
        options = dict(options) if isinstance(options, dict) else {}
        options.update(include_usage=True, continuous_usage_stats=False)
        copy["stream_options"] = options
    return json.dumps(copy, separators=(",", ":"), allow_nan=False).encode()


def path_of(features: RequestFeatures) -> str:
    return _PATHS[features.endpoint]


def traced(
    tracing: Tracing | None, primary: Primary, route: Route, url: str
) -> AbstractContextManager[Call]:
    """The copy's call as a trace sees it (gateway/wire/tracing.py's shadow_call): the
    headers to send with it, its span's or the user's."""
    asked = {"model": primary.model, "max_tokens": primary.completion_tokens}
    return shadow_call(
        tracing,
        primary.trace,
        endpoint=primary.features.endpoint,
        body=asked,
        route=route.value,
        url=url,
        of=primary.request_id,
    )


@dataclass(frozen=True, slots=True)
class ShadowAnswer:
    """What a shadow's answer showed: its timing, usage and acceptance; no text."""

    duration_s: float
    ttft_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    acceptance: MeasuredAcceptance | None


class ShadowFailed(Exception):
    """The shadow got no complete answer (refused, 4xx/5xx, broken, stalled)."""


@dataclass(slots=True)
class _Reading:
    started: float
    ttft_s: float | None = None
    token_events: int = 0
    report: dict[str, Any] | None = None


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    stream: bool,
    read_timeout_s: float,
    connect_timeout_s: float,
    on_first_token: Callable[[], None],
) -> tuple[float, float | None, int, dict[str, Any] | None]:
    """Send one shadow and read its answer to the end; return (e2e s, TTFT s, token
    events, the usage report). Cancelling it closes the connection: vLLM aborts."""
    reading = _Reading(time.perf_counter())
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
    )
    try:
        response = await session.post(url, data=body, headers=headers, timeout=timeout)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise ShadowFailed(type(exc).__name__) from None
    try:
        if response.status != 200:
            raise ShadowFailed(f"http {response.status}")
        if stream:
            await _drain(response, reading, on_first_token)
        else:
            reading.report = loads_object(await response.read())
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        response.close()
        raise ShadowFailed(type(exc).__name__) from None
    except BaseException:
        response.close()  # cancelled: the connection goes, and vLLM aborts the request
        raise
    response.release()
    duration = time.perf_counter() - reading.started
    return duration, reading.ttft_s, reading.token_events, reading.report


async def _drain(
    response: aiohttp.ClientResponse, reading: _Reading, on_first_token: Callable[[], None]
) -> None:
    """Read a stream to its end, noting its first token, its steps and its usage."""
    pending = b""
    async for data in response.content.iter_any():
        pending += data
        *events, pending = pending.split(_EVENT_END)
        for event in events:
            if not event.startswith(b"data: {"):
                continue
            parsed = loads_object(event[6:])
            if parsed is None:
                continue
            if isinstance(parsed.get("usage"), dict):
                reading.report = parsed
            if has_token(parsed):
                reading.token_events += 1
                if reading.ttft_s is None:
                    reading.ttft_s = time.perf_counter() - reading.started
                    on_first_token()


def answer_of(
    measured: tuple[float, float | None, int, dict[str, Any] | None],
    route: Route,
    features: RequestFeatures,
    num_speculative_tokens: int,
    attributed: AttributedRate | None,
) -> ShadowAnswer:
    """The figures of a read answer; acceptance (speculative side) from the best
    source it has (gateway/wire/acceptance.py)."""
    duration, ttft, token_events, report = measured
    usage = report.get("usage") if report else None
    usage = usage if isinstance(usage, dict) else {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    completion = completion if isinstance(completion, int) else None
    acceptance = None
    if num_speculative_tokens > 0:
        acceptance = measured_acceptance(
            report,
            completion,
            token_events,
            features.stream and features.n == 1,
            attributed(route, features.workload) if attributed is not None else None,
            num_speculative_tokens,
        )
    return ShadowAnswer(
        duration, ttft, prompt if isinstance(prompt, int) else None, completion, acceptance
    )
