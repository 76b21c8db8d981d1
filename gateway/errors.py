"""Every error leaves the gateway in OpenAI's shape, through one middleware.

Clients are OpenAI SDKs: they parse `{"error": {"message", "type", "param",
"code"}}` and show the message. A stack trace or an HTML error page would reach
the user as an unreadable exception, so nothing else may leave.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping

import structlog
from aiohttp import web

log = structlog.get_logger("specroute.errors")
request_log = structlog.get_logger("specroute.request")
# Set by a handler that writes the request's canonical log line itself.
LOGGED = web.RequestKey("specroute_logged", bool)
REQUEST_ID = web.RequestKey("specroute_request_id", str)
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable_error",
    504: "upstream_timeout_error",
}


class APIError(Exception):
    """An error the gateway answers itself (as opposed to one a backend sent)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> bytes:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    payload = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return json.dumps(payload).encode()


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    return web.Response(
        status=status,
        body=error_body(status, message, param=param, code=code),
        content_type="application/json",
        headers=headers,
    )


def draining() -> APIError:
    """What a new request gets once SIGTERM came (gateway/serve.py)."""
    return APIError(
        503, "the gateway is shutting down", code="draining", headers={"Retry-After": "1"}
    )


def request_id(request: web.Request) -> str:
    """The request's id, the same each time it is asked: the client's X-Request-Id if
    it is a safe token, else a fresh one. The backend, the log and the client get it."""
    known = request.get(REQUEST_ID)
    if known is None:
        known = request[REQUEST_ID] = request_id_of(request.headers)
    return known


def request_id_of(headers: Mapping[str, str]) -> str:
    """The client's X-Request-Id if it is a safe token, else a fresh one."""
    given = headers.get("X-Request-Id", "")
    return given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """OpenAI's error shape for everything, and a log line for every refusal
    (401, 404, ...) that no handler logged."""
    response = await _answer(request, handler)
    if response.status >= 400 and not request.get(LOGGED, False):
        request_log.info(
            "request",
            request_id=request_id(request),
            method=request.method,
            path=request.path,
            status=f"{response.status // 100}xx",
            http_status=response.status,
        )
    return response


async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as exc:
        return error_response(
            exc.status, exc.message, param=exc.param, code=exc.code, headers=exc.headers
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.text if exc.text and exc.content_type == "text/plain" else exc.reason
        if exc.status == 404:
            message = f"no route for {request.method} {request.path}"
        elif exc.status == 405:
            message = f"method {request.method} not allowed on {request.path}"
        return error_response(exc.status, message, headers=_carry_headers(exc))
    except Exception:
        # A bug of ours: log it with its traceback, tell the client only that it happened.
        log.exception("unhandled_error", path=request.path)
        return error_response(500, "internal gateway error", code="internal_error")


def _carry_headers(exc: web.HTTPException) -> dict[str, str]:
    keep = ("Allow", "Retry-After")
    return {k: v for k, v in exc.headers.items() if k in keep}


def sse_error_event(message: str, *, code: str) -> bytes:
    """The event a stream ends with when its upstream fails after bytes were sent."""
    payload = json.loads(error_body(502, message, code=code))
    return b"data: " + json.dumps(payload).encode() + b"\n\ndata: [DONE]\n\n"
