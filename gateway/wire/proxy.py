"""Forward one request to one backend and stream its answer back unchanged.

The answer's bytes are relayed as they arrive. The only event the gateway may
drop is the usage-only chunk it asked for itself (the client did not ask for
usage, the gateway needs it to measure); every other SSE event reaches the
client byte for byte (framed with LF, as vLLM frames them, if a backend used CRLF).
A client that goes away cancels the handler, which closes the upstream connection:
vLLM then aborts the generation instead of computing tokens nobody will read. A client
that stays but stops reading is hung up on after server.send_timeout_s without progress
(gateway/wire/limits.py), which ends the same way.

Whatever a backend does wrong (refuses, stalls, drips, cuts the answer, sends what
no parser takes, ends a stream early) is one UpstreamFailure, classed by
upstream_failure: failed over when the client has no byte yet, else the stream's
error event; either way counted by its kind.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import structlog
from aiohttp import web

from gateway.config import Config
from gateway.errors import error_response, sse_error_event
from gateway.wire.failures import (
    STALL,
    UPSTREAM_ERRORS,
    BadAnswer,
    UpstreamFailure,
    drained,
    upstream_failure,
)
from gateway.wire.life import CLIENT_DISCONNECT, CLIENT_SEND_TIMEOUT, UPSTREAM_ERROR_EVENT, Meter
from gateway.wire.limits import ClientStuck, hang_up, send_within
from gateway.wire.relays import is_drain
from gateway.wire.sse import EventCutter
from gateway.wire.tracing import TRACE_HEADERS

_EVENT_END = b"\n\n"
_DONE = b"data: [DONE]"
_DONE_EVENT = _DONE + _EVENT_END
# An event that is an error object (vLLM's shape); inside generated text the
# quotes would be escaped, so this never matches an answer's content.
_ERROR_EVENT = b'data: {"error"'
# With the client's W3C trace context, so the backend's spans join the client's trace
# (with tracing on, the call's own span's headers replace them: Target.headers).
_FORWARDED_REQUEST_HEADERS = ("Content-Type", "Accept", "User-Agent", *TRACE_HEADERS)
# The gateway reads every answer (usage, first token, vLLM's metrics), so it
# asks for plain bytes; a backend that compresses anyway is passed through
# with its Content-Encoding, so the client can still decode it.
_UPSTREAM_ENCODING = {"Accept-Encoding": "identity"}
_PASSED_RESPONSE_HEADERS = ("Content-Type", "Content-Encoding")
# aiohttp sends a bytes body in one write (and warns past 1 MiB); larger ones go
# from a BytesIO in chunks, so one big body does not hold the event loop.
_RAW_BODY_MAX = 1024 * 1024
# A whole answer goes to the client in pieces of aiohttp's write buffer size, so the send
# timeout bounds each piece's progress, not the whole answer's time on a slow link.
_WHOLE_PIECE = 64 * 1024

log = structlog.get_logger("specroute.proxy")

# Reads a run of complete SSE events as they pass (first token, usage, errors into
# the meter) and returns the bytes to send on; the bool: drop the usage chunk we
# asked for. One per API: chat and completions' chunks, the Responses API's events.
EventReader = Callable[[bytes, Meter, bool], bytes]


@dataclass(frozen=True, slots=True)
class Target:
    base_url: str
    name: str  # the backend's route name, for errors and metrics
    headers: dict[str, str]  # sent last: the backend's own, the call's trace context
    request_id: str  # the id the gateway logs and returns, so the two logs join


@dataclass(frozen=True, slots=True)
class AnswerBounds:
    """How slow and how big a backend's answer may be.

    read_timeout_s bounds the silence between two reads (aiohttp's sock_read). A
    backend that drips a byte at a time never meets that bound, so an SSE event must
    also be whole within read_timeout_s of its first byte, and a whole answer within
    read_timeout_s of its headers: vLLM writes each event, and a whole answer, in one
    go, so a healthy backend's take microseconds.

    max_event_bytes bounds what is buffered while an event has not ended. The biggest
    events vLLM sends repeat the prompt (a completions echo, prompt logprobs), so the
    bound follows the biggest body the gateway admits: four times server.max_body_bytes
    (16 MiB by default), room for JSON's escapes.

    send_timeout_s bounds how long one write may wait on a client that does not read.
    """

    read_timeout_s: float
    max_event_bytes: int
    send_timeout_s: float

    @classmethod
    def of(cls, config: Config) -> AnswerBounds:
        server = config.server
        return cls(config.upstream.read_timeout_s, 4 * server.max_body_bytes, server.send_timeout_s)


async def open_upstream(
    request: web.Request,
    session: aiohttp.ClientSession,
    target: Target,
    body: bytes,
    *,
    connect_timeout_s: float,
    read_timeout_s: float,
) -> aiohttp.ClientResponse:
    """Send the request; return the backend's response once its headers are in."""
    headers = {k: v for k in _FORWARDED_REQUEST_HEADERS if (v := request.headers.get(k))}
    headers.update(_UPSTREAM_ENCODING)
    headers["X-Request-Id"] = target.request_id
    headers.update(target.headers)
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
    )
    name = target.name
    try:
        data = io.BytesIO(body) if len(body) > _RAW_BODY_MAX else body
        return await session.post(
            f"{target.base_url}{request.path}", data=data, headers=headers, timeout=timeout
        )
    except asyncio.CancelledError as exc:
        if not is_drain(exc):
            raise
        _uncancel()
        raise drained() from None
    except UPSTREAM_ERRORS as exc:
        failure = upstream_failure(exc, name)
        event = "upstream_unreachable" if failure.dead else "upstream_failed"
        log.warning(
            event, backend=name, url=target.base_url, kind=failure.kind, detail=str(exc)[:200]
        )
        raise failure from None


@dataclass(frozen=True, slots=True)
class Relay:
    """How one answer is relayed: whose it is, what the client's response carries, and
    what its events say."""

    name: str  # the backend's route name, for errors
    headers: dict[str, str]  # the gateway's own response headers
    strip_usage_chunk: bool  # drop the usage chunk the gateway asked for
    read_events: EventReader
    bounds: AnswerBounds


async def relay(
    request: web.Request, upstream: aiohttp.ClientResponse, meter: Meter, how: Relay
) -> web.StreamResponse:
    """Stream (or copy) the backend's answer to the client; always closes `upstream`.

    A whole answer that fails before the client got a byte raises UpstreamFailure,
    as a failure to connect does: another backend may answer it."""
    try:
        if upstream.status == 200 and upstream.content_type == "text/event-stream":
            return await _relay_stream(request, upstream, meter, how)
        return await _relay_whole(request, upstream, meter, how)
    finally:
        # On success the body was read to the end and the connection goes back
        # to the pool; on cancellation or error it is closed, which is what
        # makes vLLM abort the request.
        upstream.close()


def failure_response(
    meter: Meter, failure: UpstreamFailure, response_headers: dict[str, str]
) -> web.Response:
    return _fail(meter, failure.kind, failure.status, failure.message, response_headers)


async def _relay_whole(
    request: web.Request, upstream: aiohttp.ClientResponse, meter: Meter, how: Relay
) -> web.StreamResponse:
    try:
        payload = await _read_whole(upstream, how.bounds.read_timeout_s)
    except asyncio.CancelledError as exc:
        if not is_drain(exc):
            raise
        _uncancel()
        raise drained() from None
    except UPSTREAM_ERRORS as exc:
        raise upstream_failure(exc, how.name, answered=True) from None
    meter.status = upstream.status
    headers = dict(how.headers)
    headers["Content-Type"] = "application/json"
    headers.update({k: v for k in _PASSED_RESPONSE_HEADERS if (v := upstream.headers.get(k))})
    response = _WholeResponse(status=upstream.status, headers=headers)
    response.content_length = len(payload)
    # Send it now: the parsing and accounting below are ours, not the client's, to wait for.
    await _to_client(request, meter, _send_whole(request, response, payload, how))
    meter.finish()
    meter.bytes_sent = len(payload)
    if upstream.status == 200 and upstream.content_type == "application/json":
        meter.report = loads_object(payload)
        if meter.report is not None:
            meter.usage = usage_in(meter.report) or meter.usage
    elif upstream.status >= 500 and meter.error_kind is None:
        meter.fail("http_5xx")  # a 4xx is the client's, not the backend's, failure
    return response


async def _read_whole(upstream: aiohttp.ClientResponse, timeout_s: float) -> bytes:
    """The whole answer; a drip is a stall. A small answer is usually all in with its
    headers: then there is nothing to wait for, and no timer to arm and cancel."""
    if upstream.content.is_eof():
        return await upstream.read()
    async with asyncio.timeout(timeout_s):
        return await upstream.read()


class _WholeResponse(web.StreamResponse):
    """A whole answer: its headers leave with its first bytes, one write to the socket
    instead of two (a small answer's second syscall was a tenth of the relay's CPU).
    A stream's headers still leave at once: its first event may be seconds away."""

    _send_headers_immediately = False


async def _relay_stream(
    request: web.Request, upstream: aiohttp.ClientResponse, meter: Meter, how: Relay
) -> web.StreamResponse:
    """The status goes out now; a failure after it ends the stream with an error event."""
    response = web.StreamResponse(status=200, headers=how.headers)
    response.content_type = "text/event-stream"
    response.headers["Cache-Control"] = "no-cache"
    encoding = upstream.headers.get("Content-Encoding", "identity")
    if encoding != "identity":
        response.headers["Content-Encoding"] = encoding
    meter.status = 200
    await response.prepare(request)
    await _to_client(request, meter, _stream(upstream, response, meter, how))
    meter.finish()
    return response


async def _stream(
    upstream: aiohttp.ClientResponse, response: web.StreamResponse, meter: Meter, how: Relay
) -> None:
    """The events, then the end of the body; a failure after the status is an error event."""
    timeout_s = how.bounds.send_timeout_s
    try:
        if response.headers.get("Content-Encoding", "identity") == "identity":
            await _relay_events(upstream, response, meter, how)
        else:  # compressed anyway: relayed as it comes, unread
            async for data in upstream.content.iter_any():
                await _send(response, meter, data, timeout_s)
    except asyncio.CancelledError as exc:
        if not is_drain(exc):
            raise
        _uncancel()
        why = "the gateway is shutting down"
        await _end_stream_with_error(response, meter, "drained", why, timeout_s)
    except UPSTREAM_ERRORS as exc:
        failure = upstream_failure(exc, how.name, answered=True)
        await _end_stream_with_error(response, meter, failure.kind, failure.message, timeout_s)
    meter.finish()
    await _write(response.write_eof(), timeout_s)  # the client may be gone by now too


async def _send_whole(
    request: web.Request, response: web.StreamResponse, payload: bytes, how: Relay
) -> None:
    timeout_s = how.bounds.send_timeout_s
    if len(payload) <= _WHOLE_PIECE:  # one piece: one write, under one timeout
        await _write(_send_one_piece(request, response, payload), timeout_s)
        return
    await _write(response.prepare(request), timeout_s)
    view = memoryview(payload)
    for start in range(0, len(payload), _WHOLE_PIECE):
        await _write(response.write(view[start : start + _WHOLE_PIECE]), timeout_s)
    await _write(response.write_eof(), timeout_s)


async def _send_one_piece(
    request: web.Request, response: web.StreamResponse, payload: bytes
) -> None:
    """Headers, body and end in one call to the socket (the headers wait for the body:
    _WholeResponse)."""
    await response.prepare(request)
    await response.write_eof(payload)


async def _to_client(request: web.Request, meter: Meter, sending: Awaitable[None]) -> None:
    """Run what writes the answer; a client gone, or stuck (hung up on), ends it."""
    try:
        await sending
    except _ClientGone:
        meter.fail(CLIENT_DISCONNECT)
    except ClientStuck:
        meter.fail(CLIENT_SEND_TIMEOUT)
        hang_up(request)


async def _relay_events(
    upstream: aiohttp.ClientResponse, response: web.StreamResponse, meter: Meter, how: Relay
) -> None:
    """Each run of whole events, as it comes; raises what the backend did wrong."""
    bounds, read_events, strip = how.bounds, how.read_events, how.strip_usage_chunk
    events = EventCutter(bounds.max_event_bytes)
    clock = asyncio.get_running_loop().time
    due: float | None = None  # when the event begun must be whole (AnswerBounds)
    async for data in upstream.content.iter_any():
        complete = events.feed(data)
        if complete:
            due = None
            await _send(response, meter, read_events(complete, meter, strip), bounds.send_timeout_s)
        if events.pending:
            if due is None:
                due = clock() + bounds.read_timeout_s
            elif clock() > due:
                why = f"sent no whole event in {bounds.read_timeout_s:g} s"
                raise BadAnswer(STALL, why)
    if not meter.ended:
        # Cut short, however cleanly: what came after the last whole event is not
        # relayed, since the error event that follows would run into it.
        raise BadAnswer("upstream_truncated", "ended the stream before its last event")
    await _send(response, meter, events.rest(), bounds.send_timeout_s)


def _uncancel() -> None:
    """Our own drain cancelled the relay: the request goes on to end properly."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


class _ClientGone(Exception):
    """The client closed its connection while we were writing to it (not an OSError, so
    that no except for a backend's failures takes it)."""


async def _send(response: web.StreamResponse, meter: Meter, data: bytes, timeout_s: float) -> None:
    if not data:
        return
    await _write(response.write(data), timeout_s)
    meter.bytes_sent += len(data)


async def _write(write: Awaitable[object], timeout_s: float) -> None:
    """One write to the client: raises _ClientGone, or ClientStuck (gateway/wire/limits.py)."""
    try:
        await send_within(write, timeout_s)
    except ConnectionResetError:
        raise _ClientGone from None


def read_chat_events(chunk: bytes, meter: Meter, strip_usage_chunk: bool) -> bytes:
    """Chat and completions chunks: note the first token, the usage and the step count;
    drop the usage chunk we asked for."""
    meter.events += chunk.count(_EVENT_END)
    meter.ended = chunk.endswith(_DONE_EVENT)  # [DONE] is the last event a stream sends
    if _ERROR_EVENT in chunk and meter.error_kind is None:
        # vLLM ends a stream that failed midway (an engine error after the
        # status was sent) with an error event and [DONE]: relayed as it is,
        # but the request failed, and is logged and counted so.
        meter.fail(UPSTREAM_ERROR_EVENT)
    if meter.ttft_s is not None and b'"usage"' not in chunk:
        if _DONE in chunk:  # the hot path: nothing else to look at
            meter.closing_events += 1
        return chunk
    kept: list[bytes] = []
    for event in chunk.split(_EVENT_END)[:-1]:
        event_bytes = event + _EVENT_END
        if event.startswith(_DONE):
            meter.closing_events += 1
        parsed = None
        if event.startswith(b"data: {") and (meter.ttft_s is None or b'"usage"' in event):
            parsed = loads_object(event[6:])
        if parsed is not None:
            usage = parsed.get("usage")
            final = isinstance(usage, dict) and not parsed.get("choices")
            if isinstance(usage, dict):
                meter.usage = usage
                meter.report = parsed
            if final:
                meter.closing_events += 1
                if strip_usage_chunk:
                    continue
            elif meter.ttft_s is None:
                if has_token(parsed):
                    meter.first_token()
                else:
                    meter.events_before_token += 1
        kept.append(event_bytes)
    return b"".join(kept)


def usage_in(report: dict[str, Any]) -> dict[str, Any] | None:
    """An answer's usage under chat's names: the Responses API counts input_tokens and
    output_tokens, which the record reads as prompt_tokens and completion_tokens."""
    usage = report.get("usage")
    if not isinstance(usage, dict):
        return None
    if "completion_tokens" in usage or "output_tokens" not in usage:
        return usage
    return {
        **usage,
        "prompt_tokens": usage.get("input_tokens"),
        "completion_tokens": usage.get("output_tokens"),
    }


def has_token(chunk: dict[str, Any]) -> bool:
    """The first token, as the gateway, the bench and vLLM's TTFT count it: any generated
    text, reasoning included (a reasoning model's answer starts there)."""
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(
            delta.get(k) for k in ("content", "tool_calls", "reasoning_content", "reasoning")
        ):
            return True
    return False


async def _end_stream_with_error(
    response: web.StreamResponse, meter: Meter, kind: str, why: str, timeout_s: float
) -> None:
    meter.fail(kind)  # the status stays 200: it was sent already
    event = sse_error_event(f"backend stream interrupted: {why}", code=kind)
    await _write(response.write(event), timeout_s)


def _fail(
    meter: Meter, kind: str, status: int, message: str, response_headers: dict[str, str]
) -> web.Response:
    meter.fail(kind, status)
    meter.finish()
    return error_response(status, message, code=kind, headers=response_headers)


def loads_object(raw: bytes) -> dict[str, Any] | None:
    """A JSON object from bytes, or None for anything else (broken JSON, a list).

    orjson first (a whole answer's parse took a tenth of json's time); what it refuses
    and json takes (NaN, Infinity, a lone surrogate) is json's, as before."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            value = json.loads(raw)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None
