"""Every other path of vLLM's OpenAI server, through the same base_url, with its fate.

What an application calls (tokenize, embeddings, score, audio, ...) is passed
to a healthy backend unchanged: method, query, body, status, headers and
streamed bytes, less the hop-by-hop headers and the client's key (a backend gets
its own). An unknown read gets vLLM's own answer (its 404), not the gateway's.

What an operator calls is never forwarded. The rule that decides is an
allow-list for whatever may change a server's state, and a deny list only for
reads:
- A safe method (GET, HEAD, OPTIONS) changes nothing by HTTP's contract: it is
  passed through, except vLLM's development and admin reads (sleep and pause
  state, weights, server info, ...), listed in OPERATOR_PATHS with their writes.
- Any other method is refused (403) unless it is a POST to one of COMPUTE_PATHS:
  calls that compute an answer from their body and keep nothing. A guessed deny list
  would open whatever admin endpoint the next vLLM release adds; this way a new
  write is refused until someone looks at it (tests/vllm walks vLLM's route table
  and fails on a path whose fate nobody decided).
Auth (gateway/auth.py) runs before any of this, on every path.
"""

from __future__ import annotations

import asyncio
import enum
import posixpath
import re
import time
from collections.abc import Awaitable, Sequence

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict, MultiMapping
from yarl import URL

from gateway.backends.pool import Backend, Upstream
from gateway.errors import LOGGED, APIError, draining, request_id
from gateway.outcomes.accounting import NO_ROUTE
from gateway.request.dispatch import ROUTE_HEADER, note_failure
from gateway.state import BACKENDS, RUNTIME, SESSION
from gateway.wire.failures import UPSTREAM_ERRORS, upstream_failure
from gateway.wire.limits import ClientStuck, hang_up, send_within
from gateway.wire.tracing import TRACING, carried, log_fields, passthrough_call

log = structlog.get_logger("specroute.passthrough")
request_log = structlog.get_logger("specroute.request")


class Fate(enum.StrEnum):
    ROUTED = "routed"  # decided per request by the policy (request/pipeline.py)
    STORED = "stored"  # to the server that stored the response it names (request/responses.py)
    GATEWAY = "gateway"  # the gateway's own answer
    PASSTHROUGH = "passthrough"  # to a healthy backend, unchanged
    FORBIDDEN = "forbidden"  # an operator's endpoint: 403, logged


ROUTED_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
STORED_PATHS = ("/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel")
# The gateway's own, whatever vLLM serves under the same name (its /metrics, /health),
# and what lies under them: vLLM (Starlette's redirect_slashes) answers /health/ and
# /v1/models/ with a 307 built from the Host it was sent, the backend's own address.
GATEWAY_PATHS = ("/health", "/ready", "/metrics", "/stats", "/openapi.json", "/v1/models")
GATEWAY_PREFIXES = ("/ui", "/decide/")
# vLLM mounts its Prometheus app on a bare prefix (`^/metrics(?P<path>.*)$`): /metricsX and
# /metrics%2F would reach it past the gateway's metrics token. Of GATEWAY_PATHS only /metrics
# is mounted so (the rest are exact routes); any path that starts with it is the gateway's.
GATEWAY_STEMS = ("/metrics",)
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")

# vLLM's development and admin endpoints (VLLM_SERVER_DEV_MODE, the RL and weight
# transfer family, LoRA loading, the profiler, elastic EP, fault tolerance,
# SageMaker's adapters and sessions): never forwarded, reads included.
OPERATOR_PATHS = frozenset(
    {
        "/sleep", "/wake_up", "/is_sleeping", "/release_kv_cache_memory",
        "/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache",
        "/collective_rpc", "/server_info",
        "/pause", "/resume", "/is_paused", "/abort_requests", "/inference/v1/abort_requests",
        "/init_weight_transfer_engine", "/shutdown_weight_transfer_engine",
        "/start_weight_update", "/start_draft_weight_update", "/update_weights",
        "/finish_weight_update", "/update_weight_version", "/weight_info",
        "/weight_checker", "/get_world_size",
        "/v1/load_lora_adapter", "/v1/unload_lora_adapter",
        "/start_profile", "/stop_profile",
        "/scale_elastic_ep", "/is_scaling_elastic_ep",
        # SageMaker's entry point: it opens sessions and picks adapters on the server.
        "/invocations",
        "/kv_event_sources",  # the engines' KV-event publishers: the cluster's plumbing
    }
)  # fmt: skip
OPERATOR_PREFIXES = ("/adapters", "/fault_tolerance/")

# Writes that only compute an answer from their body: the only non-safe calls passed on.
COMPUTE_PATHS = frozenset(
    {
        "/tokenize", "/detokenize",
        "/v1/embeddings", "/v2/embed", "/pooling", "/classify",
        "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank",
        "/v1/audio/transcriptions", "/v1/audio/translations",
        "/v1/messages", "/v1/messages/count_tokens", "/cohere/v2/chat",
        "/v1/chat/completions/batch", "/generative_scoring", "/v1/systemone",
        "/inference/v1/generate",
        "/v1/chat/completions/render", "/v1/completions/render",
        "/v1/messages/render", "/v1/responses/render",
        "/v1/chat/completions/derender", "/v1/completions/derender",
        "/ping",  # SageMaker's health check, also answered to POST
    }
)  # fmt: skip

# RFC 9110 7.6.1's hop-by-hop headers, and what aiohttp sets itself.
_HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
        "proxy-connection", "te", "trailer", "trailers", "transfer-encoding", "upgrade",
    }
)  # fmt: skip
_NOT_SENT_ON = _HOP_BY_HOP | {"host", "content-length", "authorization", "expect"}
_GATEWAY_HEADER = "x-specroute-"


def fate_of(method: str, path: str) -> Fate:
    """What the gateway does with `method path` (a concrete path or vLLM's template)."""
    if path in ROUTED_PATHS:
        return Fate.ROUTED
    method = method.upper()
    if _is_stored(method, path):
        return Fate.STORED
    spellings = (path, _canonical(path))
    if any(_reserved(p) for p in spellings):
        return Fate.GATEWAY
    if any(p in OPERATOR_PATHS or _under(p, OPERATOR_PREFIXES) for p in spellings):
        return Fate.FORBIDDEN
    if method in SAFE_METHODS or (method == "POST" and path in COMPUTE_PATHS):
        return Fate.PASSTHROUGH
    return Fate.FORBIDDEN


def _under(path: str, prefixes: Sequence[str]) -> bool:
    """`path` is one of `prefixes` or lies below one (a path segment, not a string prefix)."""
    return any(path == p.rstrip("/") or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def _reserved(path: str) -> bool:
    """The gateway's name space: its paths and what lies under them, and vLLM's stems."""
    return _under(path, GATEWAY_PATHS + GATEWAY_PREFIXES) or path.startswith(GATEWAY_STEMS)


def _own_route(path: str) -> bool:
    """A path one of the gateway's routes serves, by some method (another one gets 405)."""
    return path in ROUTED_PATHS or path in GATEWAY_PATHS or _under(path, GATEWAY_PREFIXES)


def _canonical(path: str) -> str:
    """The path as a server that merges slashes and resolves dot segments reads it:
    //metrics or /x/../metrics is /metrics to whatever normalises on the way."""
    return posixpath.normpath(re.sub(r"/{2,}", "/", path)) if path else path


def _is_stored(method: str, path: str) -> bool:
    """GET /v1/responses/{id} or POST /v1/responses/{id}/cancel (not .../render)."""
    parts = path.split("/")  # '', 'v1', 'responses', id[, 'cancel']
    if len(parts) not in (4, 5) or parts[1:3] != ["v1", "responses"] or not parts[3]:
        return False
    if len(parts) == 4:
        return method in SAFE_METHODS
    return method == "POST" and parts[4] == "cancel"


async def handle(request: web.Request) -> web.StreamResponse:
    """The catch-all: a path none of the gateway's routes took (or took with another
    method: the gateway's own answers 405)."""
    fate = fate_of(request.method, request.path)
    if fate is Fate.FORBIDDEN:
        log.warning(
            "forbidden_path",
            request_id=request_id(request),
            method=request.method,
            path=request.path,
        )
        raise APIError(
            403,
            f"{request.method} {request.path} is not forwarded: the gateway passes on "
            "vLLM's application endpoints only, never its admin or development ones",
            code="forbidden_path",
            headers={"X-Request-Id": request_id(request)},
        )
    if fate is Fate.GATEWAY and not _own_route(request.path):
        # Under a gateway path or a spelling of one (/metrics/, /metrics%2F, //metrics): no
        # route here serves it, and vLLM's must not see it (its /metrics would answer).
        raise APIError(
            404,
            f"no route for {request.method} {request.path}: the gateway's own paths are "
            "never forwarded",
            headers={"X-Request-Id": request_id(request)},
        )
    if fate is not Fate.PASSTHROUGH:
        raise APIError(405, f"method {request.method} not allowed on {request.path}")
    return await forward(request, targets_for(request))


def targets_for(request: web.Request) -> list[tuple[Backend, Upstream]]:
    """Every endpoint, in the order to try them: the forced route's first (the route
    header, where allowed), then the healthy before the rest, the least busy first."""
    config = request.app[RUNTIME].current.config
    wanted = request.headers.get(ROUTE_HEADER, "").strip().lower()
    forced = wanted if config.server.allow_route_override else ""
    if forced and forced not in config.routes:
        names = ", ".join(f"'{r.value}'" for r in config.routes)
        raise APIError(400, f"{ROUTE_HEADER} must name a route: one of {names}", param=ROUTE_HEADER)
    pairs = [(b, u) for b in request.app[BACKENDS] for u in b.upstreams]
    return sorted(
        pairs,
        key=lambda bu: (bu[0].route.value != forced, not bu[1].healthy, bu[1].inflight),
    )


async def forward(
    request: web.Request, targets: Sequence[tuple[Backend, Upstream]]
) -> web.StreamResponse:
    """Send the request to the first target that takes it and relay its answer.

    The next target is tried only when nothing was started: the connection was
    refused or not accepted in time, or (a safe method) the backend failed before any
    answer (dropped the connection, sent what is not HTTP). A failure counts against
    its backend as a routed request's does; a success clears nothing (a wedged engine
    still answers /version). One request id goes to the backend, the log line and the
    client; the client's trace headers go on too (gateway/wire/tracing.py).
    """
    app = request.app
    config = app[RUNTIME].current.config
    request[LOGGED] = True
    started = time.perf_counter()
    ids = {"X-Request-Id": request_id(request)}
    status, answered_by = 502, ""
    try:
        if app[RUNTIME].draining:
            raise draining()
        body = await _body(request, config.server.body_read_timeout_s)
        headers = _request_headers(request)
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=config.upstream.connect_timeout_s,
            sock_read=config.upstream.read_timeout_s,
        )
        repeatable = request.method in SAFE_METHODS
        tracing = app.get(TRACING)
        for i, (backend, upstream) in enumerate(targets):
            url = URL(upstream.url + request.rel_url.raw_path_qs, encoded=True)
            route = backend.route.value
            # Its span, if tracing is on: the trace headers sent are that span's.
            with passthrough_call(
                tracing, request.method, upstream.url + request.path, route
            ) as call:
                outgoing = headers.copy()
                outgoing.update(call.headers)  # the client's trace headers, whatever their case
                try:
                    upstream_response = await app[SESSION].request(
                        request.method,
                        url,
                        data=body or None,
                        headers={**outgoing, **backend.headers},
                        timeout=timeout,
                        allow_redirects=False,
                    )
                except UPSTREAM_ERRORS as exc:
                    failure = upstream_failure(exc, route)
                    call.failed(failure.kind)
                    note_failure(app[BACKENDS], backend, upstream, failure)
                    unsent = failure.refused or failure.kind == "connect_timeout"
                    if i == len(targets) - 1 or not (unsent or (repeatable and failure.retryable)):
                        raise APIError(failure.status, failure.message, code=failure.kind) from None
                    continue
                status, answered_by = upstream_response.status, route
                call.answered(status)
                try:
                    target = (backend, upstream)
                    send_timeout_s = config.server.send_timeout_s
                    return await _relay(request, upstream_response, target, send_timeout_s)
                finally:
                    upstream_response.close()
        raise APIError(502, "no backend to forward it to", code="upstream_unavailable")
    except APIError as exc:
        status = exc.status
        exc.headers = {**(exc.headers or {}), **ids}
        raise
    finally:
        request_log.info(  # the request's canonical line, as every request has one
            "request",
            kind="passthrough",
            request_id=ids["X-Request-Id"],
            method=request.method,
            path=request.path,
            route=answered_by or NO_ROUTE,
            http_status=status,
            status=f"{status // 100}xx",
            duration_s=round(time.perf_counter() - started, 4),
            **log_fields(carried(request)),
        )


async def _body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body, bounded by server.max_body_bytes (the app's client_max_size)."""
    if not request.body_exists:
        return b""
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise APIError(408, f"request body not received within {timeout_s:g} s") from None


def _request_headers(request: web.Request) -> CIMultiDict[str]:
    dropped = _NOT_SENT_ON | _named_in_connection(request.headers)
    headers = CIMultiDict(
        (k, v)
        for k, v in request.headers.items()
        if k.lower() not in dropped and not k.lower().startswith(_GATEWAY_HEADER)
    )
    headers["X-Request-Id"] = request_id(request)
    return headers


def _named_in_connection(headers: MultiMapping[str]) -> set[str]:
    """The headers a Connection header names: hop-by-hop too (RFC 9110 7.6.1)."""
    values = headers.getall("Connection", [])
    return {n.strip().lower() for v in values for n in v.split(",") if n.strip()}


async def _relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    target: tuple[Backend, Upstream],
    send_timeout_s: float,
) -> web.StreamResponse:
    """The backend's status, headers and bytes as they come; a body cut short is cut
    short for the client too (the connection closes: a clean end would lie). A client
    that takes no bytes for send_timeout_s is hung up on (gateway/wire/limits.py)."""
    dropped = _HOP_BY_HOP | _named_in_connection(upstream.headers)
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    for key, value in upstream.headers.items():
        if key.lower() not in dropped:
            response.headers.add(key, value)
    response.headers["X-Request-Id"] = request_id(request)
    await response.prepare(request)
    try:
        async for data in upstream.content.iter_any():
            if not await _sent(request, response.write(data), send_timeout_s):
                return response
    except UPSTREAM_ERRORS as exc:
        backend, endpoint = target
        failure = upstream_failure(exc, backend.route.value, answered=True)
        note_failure(request.app[BACKENDS], backend, endpoint, failure)
        log.warning("passthrough_broken", path=request.path, kind=failure.kind)
        if request.transport is not None:
            request.transport.close()
        return response
    await _sent(request, response.write_eof(), send_timeout_s)
    return response


async def _sent(request: web.Request, write: Awaitable[object], timeout_s: float) -> bool:
    """One write to the client; False when it went away or was hung up on (stuck)."""
    try:
        await send_within(write, timeout_s)
    except ConnectionResetError:
        return False
    except ClientStuck:
        log.info("client_send_timeout", path=request.path, timeout_s=timeout_s)
        hang_up(request)
        return False
    return True
