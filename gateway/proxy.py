"""Forward one request to one backend and stream its answer back unchanged.

The answer's bytes are relayed as they arrive. The only event the gateway may
drop is the usage-only chunk it asked for itself (the client did not ask for
usage, the gateway needs it to measure); every other SSE event reaches the
client byte for byte. A client that goes away cancels the handler, which closes
the upstream connection: vLLM then aborts the generation instead of computing
tokens nobody will read.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from gateway.errors import error_response, sse_error_event
from gateway.record import CLIENT_DISCONNECT, UPSTREAM_ERROR_EVENT, Meter
from gateway.relays import is_drain

_EVENT_END = b"\n\n"
_DONE = b"data: [DONE]"
# An event that is an error object (vLLM's shape); inside generated text the
# quotes would be escaped, so this never matches an answer's content.
_ERROR_EVENT = b'data: {"error"'
_FORWARDED_REQUEST_HEADERS = ("Content-Type", "Accept", "User-Agent")
# The gateway reads every answer (usage, first token, vLLM's metrics), so it
# asks for plain bytes; a backend that compresses anyway is passed through
# with its Content-Encoding, so the client can still decode it.
_UPSTREAM_ENCODING = {"Accept-Encoding": "identity"}
_PASSED_RESPONSE_HEADERS = ("Content-Type", "Content-Encoding")
# aiohttp sends a bytes body in one write (and warns past 1 MiB); larger ones go
# from a BytesIO in chunks, so one big body does not hold the event loop.
_RAW_BODY_MAX = 1024 * 1024

log = structlog.get_logger("specroute.proxy")

# Reads a run of complete SSE events as they pass (first token, usage, errors into
# the meter) and returns the bytes to send on; the bool: drop the usage chunk we
# asked for. One per API: chat and completions' chunks, the Responses API's events.
EventReader = Callable[[bytes, Meter, bool], bytes]


@dataclass(frozen=True, slots=True)
class Target:
    base_url: str
    name: str  # the backend's route name, for errors and metrics
    headers: dict[str, str]
    request_id: str  # the id the gateway logs and returns, so the two logs join


class UpstreamFailure(Exception):
    """The backend failed before the client got a byte: another backend may answer.

    `message` goes to the client: the route and a reason, never an address.
    `dead`: the connection failed before any answer (refused, dropped, reset):
    the backend is down or restarting. `refused`: no connection could be opened
    at all, which says the process is gone (a dropped pooled connection does not).
    """

    def __init__(
        self,
        kind: str,
        status: int,
        message: str,
        *,
        retryable: bool,
        dead: bool = False,
        refused: bool = False,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.message = message
        self.retryable = retryable
        self.dead = dead or refused
        self.refused = refused


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
        raise UpstreamFailure(
            "drained", 503, "the gateway is shutting down", retryable=False
        ) from None
    except aiohttp.ConnectionTimeoutError:
        raise UpstreamFailure(
            "connect_timeout",
            504,
            f"backend {name} did not accept the connection in time",
            retryable=True,
        ) from None
    except (aiohttp.SocketTimeoutError, TimeoutError):
        # Connected, sent, then silence: the backend may be working on it, so
        # this is a stall, not a refusal.
        raise UpstreamFailure(
            "upstream_stall", 504, f"backend {name} stopped answering", retryable=False
        ) from None
    except (aiohttp.ClientConnectionError, OSError) as exc:
        log.warning("upstream_unreachable", backend=name, url=target.base_url, detail=str(exc))
        raise UpstreamFailure(
            "connect",
            502,
            f"backend {name} unreachable: {_why(exc)}",
            retryable=True,
            dead=True,
            refused=isinstance(exc, aiohttp.ClientConnectorError),
        ) from None


async def relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    meter: Meter,
    *,
    name: str,
    response_headers: dict[str, str],
    strip_usage_chunk: bool,
    read_events: EventReader | None = None,
) -> web.StreamResponse:
    """Stream (or copy) the backend's answer to the client; always closes `upstream`."""
    try:
        if upstream.status == 200 and upstream.content_type == "text/event-stream":
            reader = read_events or read_chat_events
            return await _relay_stream(
                request, upstream, meter, response_headers, strip_usage_chunk, reader
            )
        return await _relay_whole(request, upstream, meter, response_headers, name)
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
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    meter: Meter,
    response_headers: dict[str, str],
    name: str,
) -> web.StreamResponse:
    try:
        payload = await upstream.read()
    except asyncio.CancelledError as exc:
        if not is_drain(exc):
            raise
        _uncancel()
        return _fail(meter, "drained", 503, "the gateway is shutting down", response_headers)
    except TimeoutError:  # aiohttp's read timeouts are TimeoutErrors too
        return _fail(
            meter, "upstream_stall", 504, f"backend {name} stopped answering", response_headers
        )
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
        why = f"backend {name} broke the answer: {_why(exc)}"
        return _fail(meter, "upstream_broken", 502, why, response_headers)
    meter.status = upstream.status
    headers = dict(response_headers)
    headers["Content-Type"] = "application/json"
    headers.update({k: v for k in _PASSED_RESPONSE_HEADERS if (v := upstream.headers.get(k))})
    response = web.Response(status=upstream.status, body=payload, headers=headers)
    # Send it now: the parsing and accounting below are ours, not the client's, to wait for.
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionResetError:
        meter.fail(CLIENT_DISCONNECT)
    meter.finish()
    meter.bytes_sent = len(payload)
    if upstream.status == 200 and upstream.content_type == "application/json":
        meter.report = loads_object(payload)
        if meter.report is not None:
            meter.usage = usage_in(meter.report) or meter.usage
    elif upstream.status >= 500 and meter.error_kind is None:
        meter.fail("http_5xx")  # a 4xx is the client's, not the backend's, failure
    return response


async def _relay_stream(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    meter: Meter,
    response_headers: dict[str, str],
    strip_usage_chunk: bool,
    read_events: EventReader,
) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers=response_headers)
    response.content_type = "text/event-stream"
    response.headers["Cache-Control"] = "no-cache"
    if encoding := upstream.headers.get("Content-Encoding"):
        response.headers["Content-Encoding"] = encoding
    meter.status = 200
    await response.prepare(request)
    pending = b""
    try:
        async for data in upstream.content.iter_any():
            pending += data
            cut = pending.rfind(_EVENT_END)
            if cut < 0:
                continue
            complete, pending = pending[: cut + 2], pending[cut + 2 :]
            await _send(response, meter, read_events(complete, meter, strip_usage_chunk))
        await _send(response, meter, pending)
    except _ClientGone:
        meter.fail(CLIENT_DISCONNECT)
        meter.finish()
        return response
    except asyncio.CancelledError as exc:
        if not is_drain(exc):
            raise
        _uncancel()
        await _end_stream_with_error(response, meter, "drained", "the gateway is shutting down")
    except TimeoutError:  # aiohttp's read timeouts are TimeoutErrors too
        await _end_stream_with_error(response, meter, "upstream_stall", "no data in time")
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
        await _end_stream_with_error(response, meter, "upstream_broken", _why(exc))
    meter.finish()
    try:
        await response.write_eof()
    except ConnectionResetError:  # gone between the last event and the end of the body
        meter.fail(CLIENT_DISCONNECT)
    return response


def _uncancel() -> None:
    """Our own drain cancelled the relay: the request goes on to end properly."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


class _ClientGone(Exception):
    """The client closed its connection while we were writing to it."""


async def _send(response: web.StreamResponse, meter: Meter, data: bytes) -> None:
    if not data:
        return
    try:
        await response.write(data)
    except ConnectionResetError:
        raise _ClientGone from None
    meter.bytes_sent += len(data)


def read_chat_events(chunk: bytes, meter: Meter, strip_usage_chunk: bool) -> bytes:
    """Chat and completions chunks: note the first token, the usage and the step count;
    drop the usage chunk we asked for."""
    meter.events += chunk.count(_EVENT_END)
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
    response: web.StreamResponse, meter: Meter, kind: str, why: str
) -> None:
    meter.fail(kind)  # the status stays 200: it was sent already
    event = sse_error_event(f"backend stream interrupted: {why}", code=kind)
    try:
        await response.write(event)
    except ConnectionResetError:
        meter.fail(CLIENT_DISCONNECT)


def _fail(
    meter: Meter, kind: str, status: int, message: str, response_headers: dict[str, str]
) -> web.Response:
    meter.fail(kind, status)
    meter.finish()
    return error_response(status, message, code=kind, headers=response_headers)


def loads_object(raw: bytes) -> dict[str, Any] | None:
    """A JSON object from bytes, or None for anything else (broken JSON, a list)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _why(exc: BaseException) -> str:
    """A reason a client may read: what went wrong, never where (no host or port)."""
    os_error = getattr(exc, "os_error", exc)
    if isinstance(os_error, OSError) and os_error.errno:
        return os.strerror(os_error.errno).lower()
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server disconnected"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "incomplete answer"
    return type(exc).__name__
