"""Every way a backend can fail, classed once: its kind, what the client is told, and
whether another backend may answer instead.

A backend refuses, times out, stalls, drips, cuts its answer short, sends what no
HTTP or SSE parser takes, or ends a stream before its end. Each is one
UpstreamFailure, from `upstream_failure`, whether it happened in a routed request
(gateway/request/dispatch.py, gateway/wire/proxy.py) or a passed-through one
(gateway/api/passthrough.py): its kind is the label of specroute_upstream_errors_total,
and it counts towards ejecting the backend.
"""

from __future__ import annotations

import os

import aiohttp

from gateway.wire.sse import EventTooLong

STALL = "upstream_stall"


class UpstreamFailure(Exception):
    """A backend's failure, as upstream_failure classes it. Raised when the client has
    no byte yet: then another backend may answer.

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


class BadAnswer(Exception):
    """The backend's answer broke one of the gateway's rules: no end, or too slow."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind = kind
        self.why = why


# Everything talking to a backend can raise, less cancellation: upstream_failure
# turns each into an UpstreamFailure.
UPSTREAM_ERRORS = (aiohttp.ClientError, OSError, TimeoutError, EventTooLong, BadAnswer)


def upstream_failure(exc: BaseException, name: str, *, answered: bool = False) -> UpstreamFailure:
    """Any failure of a backend (one of UPSTREAM_ERRORS) as the gateway handles it: its
    kind (specroute_upstream_errors_total's label), what the client is told (the route
    and a reason, never an address), and whether another backend may answer instead.
    `answered`: the status line had come, so the failure is in the body."""
    if isinstance(exc, BadAnswer):
        stall = exc.kind == STALL
        why = f"backend {name} {exc.why}"
        return UpstreamFailure(exc.kind, 504 if stall else 502, why, retryable=not stall)
    if isinstance(exc, EventTooLong):
        return UpstreamFailure(
            "upstream_malformed", 502, f"backend {name} sent {exc}", retryable=True
        )
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamFailure(
            "connect_timeout",
            504,
            f"backend {name} did not accept the connection in time",
            retryable=True,
        )
    if isinstance(exc, TimeoutError):  # aiohttp's read timeouts are TimeoutErrors too
        # Connected, sent, then silence: the backend may be working on it, so
        # this is a stall, not a refusal, and another backend is not asked.
        return UpstreamFailure(STALL, 504, f"backend {name} stopped answering", retryable=False)
    connection = isinstance(exc, aiohttp.ClientConnectionError | OSError)
    if isinstance(exc, aiohttp.ClientPayloadError) or (answered and connection):
        why = f"backend {name} broke the answer: {_why(exc)}"
        return UpstreamFailure("upstream_broken", 502, why, retryable=True)
    if connection:
        return UpstreamFailure(
            "connect",
            502,
            f"backend {name} unreachable: {_why(exc)}",
            retryable=True,
            dead=True,
            refused=isinstance(exc, aiohttp.ClientConnectorError),
        )
    # aiohttp's parser refused the answer (no HTTP, a header line too long, a bad
    # status line), or any other client error: the backend answered, but nonsense.
    return UpstreamFailure(
        "upstream_malformed", 502, f"backend {name} sent an answer that is not HTTP", retryable=True
    )


def drained() -> UpstreamFailure:
    """The gateway's own drain (SIGTERM) ended the answer: not the backend's failure."""
    return UpstreamFailure("drained", 503, "the gateway is shutting down", retryable=False)


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
