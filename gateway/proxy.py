"""Forward one request to one backend and stream its answer back unchanged.

The answer's bytes are relayed as they arrive. The only event the gateway may
drop is the usage-only chunk it asked for itself (the client did not ask for
usage, the gateway needs it to measure); every other SSE event reaches the
client byte for byte. A client that goes away cancels the handler, which closes
the upstream connection: vLLM then aborts the generation instead of computing
tokens nobody will read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from classifier.policy import Route
from gateway.errors import error_response, sse_error_event

_EVENT_END = b"\n\n"
_DONE = b"data: [DONE]"
_FORWARDED_REQUEST_HEADERS = ("Content-Type", "Accept", "X-Request-Id", "User-Agent")


@dataclass(slots=True)
class Exchange:
    """What happened to one forwarded request; filled in as it goes."""

    started: float
    status: int = 0
    ttft_s: float | None = None
    finished: float | None = None
    usage: dict[str, Any] | None = None
    # The final usage chunk (stream) or whole body (non-stream), for the
    # measurements that vLLM reports next to usage.
    report: dict[str, Any] | None = None
    error_kind: str | None = None
    bytes_sent: int = 0
    # SSE events seen: all of them, those before the first token (role
    # chunk), and the closing ones ([DONE], the usage-only chunk). What is
    # left is one event per engine step that produced tokens.
    events: int = 0
    events_before_token: int = 0
    closing_events: int = 0
    # Who answered (after any failover), and the load on that backend when
    # the request was sent (itself included).
    route: Route | None = None
    failover_from: Route | None = None
    batch: int = 0
    waiting: int | None = None
    # Called once when the first token arrives (the backend's prefill of it is done).
    on_first_token: Callable[[], None] | None = None

    @property
    def token_events(self) -> int:
        return self.events - self.events_before_token - self.closing_events

    @property
    def duration_s(self) -> float:
        return (self.finished or time.perf_counter()) - self.started


@dataclass(frozen=True, slots=True)
class Target:
    base_url: str
    name: str  # the backend's route name, for errors and metrics
    headers: dict[str, str]


class UpstreamFailure(Exception):
    """The backend failed before the client got a byte: another backend may answer."""

    def __init__(self, kind: str, status: int, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.message = message
        self.retryable = retryable


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
    headers.update(target.headers)
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
    )
    name = target.name
    try:
        return await session.post(
            f"{target.base_url}{request.path}", data=body, headers=headers, timeout=timeout
        )
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
        raise UpstreamFailure(
            "connect", 502, f"backend {name} unreachable: {_why(exc)}", retryable=True
        ) from None


async def relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    exchange: Exchange,
    *,
    name: str,
    response_headers: dict[str, str],
    strip_usage_chunk: bool,
) -> web.StreamResponse:
    """Stream (or copy) the backend's answer to the client; always closes `upstream`."""
    try:
        if upstream.status == 200 and upstream.content_type == "text/event-stream":
            return await _relay_stream(
                request, upstream, exchange, response_headers, strip_usage_chunk
            )
        return await _relay_whole(request, upstream, exchange, response_headers, name)
    finally:
        # On success the body was read to the end and the connection goes back
        # to the pool; on cancellation or error it is closed, which is what
        # makes vLLM abort the request.
        upstream.close()


def failure_response(
    exchange: Exchange, failure: UpstreamFailure, response_headers: dict[str, str]
) -> web.Response:
    exchange.error_kind = failure.kind
    return _fail(exchange, failure.status, failure.message, response_headers)


async def _relay_whole(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    exchange: Exchange,
    response_headers: dict[str, str],
    name: str,
) -> web.StreamResponse:
    try:
        payload = await upstream.read()
    except TimeoutError:  # aiohttp's read timeouts are TimeoutErrors too
        exchange.error_kind = "upstream_stall"
        return _fail(exchange, 504, f"backend {name} stopped answering", response_headers)
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
        exchange.error_kind = "upstream_broken"
        return _fail(
            exchange, 502, f"backend {name} broke the answer: {_why(exc)}", response_headers
        )
    exchange.status = upstream.status
    headers = dict(response_headers)
    headers["Content-Type"] = upstream.headers.get("Content-Type", "application/json")
    response = web.Response(status=upstream.status, body=payload, headers=headers)
    # Send it now: the parsing and accounting below are ours, not the client's, to wait for.
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionResetError:
        exchange.error_kind = "client_disconnect"
    exchange.finished = time.perf_counter()
    exchange.bytes_sent = len(payload)
    if upstream.status == 200 and upstream.content_type == "application/json":
        exchange.report = _loads(payload)
        if exchange.report is not None and isinstance(exchange.report.get("usage"), dict):
            exchange.usage = exchange.report["usage"]
    elif upstream.status >= 500 and exchange.error_kind is None:
        exchange.error_kind = "http_5xx"  # a 4xx is the client's, not the backend's, failure
    return response


async def _relay_stream(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    exchange: Exchange,
    response_headers: dict[str, str],
    strip_usage_chunk: bool,
) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers=response_headers)
    response.content_type = "text/event-stream"
    response.headers["Cache-Control"] = "no-cache"
    exchange.status = 200
    await response.prepare(request)
    pending = b""
    try:
        async for data in upstream.content.iter_any():
            pending += data
            cut = pending.rfind(_EVENT_END)
            if cut < 0:
                continue
            complete, pending = pending[: cut + 2], pending[cut + 2 :]
            await _send(response, exchange, _inspect_events(complete, exchange, strip_usage_chunk))
        await _send(response, exchange, pending)
    except _ClientGone:
        exchange.error_kind = "client_disconnect"
        exchange.finished = time.perf_counter()
        return response
    except TimeoutError:  # aiohttp's read timeouts are TimeoutErrors too
        await _end_stream_with_error(response, exchange, "upstream_stall", "no data in time")
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
        await _end_stream_with_error(response, exchange, "upstream_broken", _why(exc))
    exchange.finished = time.perf_counter()
    try:
        await response.write_eof()
    except ConnectionResetError:  # gone between the last event and the end of the body
        exchange.error_kind = "client_disconnect"
    return response


class _ClientGone(Exception):
    """The client closed its connection while we were writing to it."""


async def _send(response: web.StreamResponse, exchange: Exchange, data: bytes) -> None:
    if not data:
        return
    try:
        await response.write(data)
    except ConnectionResetError:
        raise _ClientGone from None
    exchange.bytes_sent += len(data)


def _inspect_events(chunk: bytes, exchange: Exchange, strip_usage_chunk: bool) -> bytes:
    """Note the first token, the usage and the step count; drop the usage chunk we asked for."""
    exchange.events += chunk.count(_EVENT_END)
    if exchange.ttft_s is not None and b'"usage"' not in chunk:
        if _DONE in chunk:  # the hot path: nothing else to look at
            exchange.closing_events += 1
        return chunk
    kept: list[bytes] = []
    for event in chunk.split(_EVENT_END)[:-1]:
        event_bytes = event + _EVENT_END
        if event.startswith(_DONE):
            exchange.closing_events += 1
        parsed = None
        if event.startswith(b"data: {") and (exchange.ttft_s is None or b'"usage"' in event):
            parsed = _loads(event[6:])
        if parsed is not None:
            usage = parsed.get("usage")
            final = isinstance(usage, dict) and not parsed.get("choices")
            if isinstance(usage, dict):
                exchange.usage = usage
                exchange.report = parsed
            if final:
                exchange.closing_events += 1
                if strip_usage_chunk:
                    continue
            elif exchange.ttft_s is None:
                if _has_token(parsed):
                    exchange.ttft_s = time.perf_counter() - exchange.started
                    if exchange.on_first_token is not None:
                        exchange.on_first_token()
                else:
                    exchange.events_before_token += 1
        kept.append(event_bytes)
    return b"".join(kept)


def _has_token(chunk: dict[str, Any]) -> bool:
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
    response: web.StreamResponse, exchange: Exchange, kind: str, why: str
) -> None:
    exchange.error_kind = kind  # the status stays 200: it was sent already
    event = sse_error_event(f"backend stream interrupted: {why}", code=kind)
    try:
        await response.write(event)
    except ConnectionResetError:
        exchange.error_kind = "client_disconnect"


def _fail(
    exchange: Exchange, status: int, message: str, response_headers: dict[str, str]
) -> web.Response:
    exchange.status = status
    exchange.finished = time.perf_counter()
    code = exchange.error_kind
    return error_response(status, message, code=code, headers=response_headers)


def _loads(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
