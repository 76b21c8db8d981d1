"""Send a routed request to a backend, failing over to the other one when that is safe.

Both backends serve the same model, so each is the other's fallback. A
failure before the client received a byte (connection refused, connect
timeout, a 5xx status) is retried once on the other backend, within a retry
budget; a 4xx is the client's problem and is relayed, and once bytes have
been sent nothing is retried (the client would see a spliced answer).
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from classifier.policy import Route
from gateway.backends import BackendPool
from gateway.config import Config
from gateway.errors import APIError
from gateway.proxy import Target, UpstreamFailure, failure_response, open_upstream, relay
from gateway.record import RequestLife
from gateway.state import BACKENDS, RELAYS, SESSION

ROUTE_HEADER = "x-specroute-route"
REASON_HEADER = "x-specroute-reason"
FAILOVER_HEADER = "x-specroute-failover"
PREDICTED_HEADER = "x-specroute-predicted"
_RELAY_FAILURES = ("upstream_broken", "upstream_stall", "http_5xx")


@dataclass(frozen=True, slots=True)
class Routed:
    route: Route
    reason: str
    body: bytes
    strip_usage_chunk: bool
    request_id: str
    predicted: str | None = None  # both predicted latencies, for the response header
    # Counted in its backend's pending prefill until the first token comes back
    # (streams only: a non-streamed answer shows no first token).
    prefill_tokens: int = 0


@dataclass(frozen=True, slots=True)
class _FailOver:
    """Returned by the first attempt when the other backend should answer.

    budgeted: the move took a slot of the retry budget (a sick backend's 5xx
    or timeout). Moving away from a backend that refused the connection is
    not a retry: it is down, and the same model answers on the other one.
    """

    budgeted: bool


async def dispatch(
    request: web.Request, routed: Routed, life: RequestLife, config: Config
) -> web.StreamResponse:
    pool = request.app[BACKENDS]
    route = _admit(pool, config, routed.route, life)
    answer = await _attempt(request, routed, life, config, route, may_retry=True)
    if isinstance(answer, web.StreamResponse):
        return answer
    life.failed_over(route)
    try:
        retried = await _attempt(request, routed, life, config, route.other, may_retry=False)
    finally:
        if answer.budgeted:
            pool.release_retry()
    assert isinstance(retried, web.StreamResponse)
    return retried


async def _attempt(
    request: web.Request,
    routed: Routed,
    life: RequestLife,
    config: Config,
    route: Route,
    *,
    may_retry: bool,
) -> web.StreamResponse | _FailOver:
    app = request.app
    pool = app[BACKENDS]
    backend = pool.of(route)
    upstream = backend.pick()
    meter = life.meter
    headers = {
        ROUTE_HEADER: route.value,
        REASON_HEADER: routed.reason,
        "X-Request-Id": routed.request_id,
    }
    if life.failover_from is not None:
        headers[FAILOVER_HEADER] = life.failover_from.value
    if routed.predicted is not None:
        headers[PREDICTED_HEADER] = routed.predicted
    with pool.track(backend, upstream, routed.prefill_tokens) as prefilled, app[RELAYS].running():
        meter.on_first_token = prefilled
        life.sent_to(route, backend.inflight)
        try:
            response = await open_upstream(
                request,
                app[SESSION],
                Target(upstream.url, route.value, backend.headers, routed.request_id),
                routed.body,
                connect_timeout_s=config.upstream.connect_timeout_s,
                read_timeout_s=config.upstream.read_timeout_s,
            )
        except UpstreamFailure as failure:
            pool.report_failure(backend, upstream, failure.kind)
            if failure.refused:
                pool.report_refused(backend, upstream)
                if may_retry and _can_take(pool, config, route.other, ejected_too=True):
                    return _FailOver(budgeted=False)
            elif failure.retryable and may_retry and _retry_allowed(pool, config, route):
                return _FailOver(budgeted=True)
            return failure_response(meter, failure, headers)
        if response.status >= 500 and may_retry and _retry_allowed(pool, config, route):
            response.close()
            pool.report_failure(backend, upstream, "http_5xx")
            return _FailOver(budgeted=True)
        answer = await relay(
            request,
            response,
            meter,
            name=route.value,
            response_headers=headers,
            strip_usage_chunk=routed.strip_usage_chunk,
        )
    if meter.error_kind in _RELAY_FAILURES:
        pool.report_failure(backend, upstream, meter.error_kind or "")
    elif meter.error_kind is None:
        pool.report_success(upstream)
    return answer


def _can_take(pool: BackendPool, config: Config, route: Route, *, ejected_too: bool) -> bool:
    """Failover is on and `route` has room and is healthy (or, with ejected_too, at
    least answers its /health: ejected for errors, but better than a dead one)."""
    backend = pool.of(route)
    usable = backend.healthy or (ejected_too and backend.reachable)
    return config.upstream.failover and usable and backend.has_room


def _retry_allowed(pool: BackendPool, config: Config, route: Route) -> bool:
    """Retry a sick backend's failure on the other one, within the retry budget."""
    if not _can_take(pool, config, route.other, ejected_too=False):
        return False
    upstream = config.upstream
    return pool.try_acquire_retry(upstream.retry_budget_ratio, upstream.retry_budget_min)


def _admit(pool: BackendPool, config: Config, route: Route, life: RequestLife) -> Route:
    """Where the request goes first: the chosen backend if it is healthy and has room,
    else the other (an override or a static route included), else 429."""
    chosen = pool.of(route)
    if chosen.healthy and chosen.has_room:
        return route
    other = route.other
    if _can_take(pool, config, other, ejected_too=False) or (
        not chosen.reachable and _can_take(pool, config, other, ejected_too=True)
    ):
        life.failed_over(route)
        return other
    if chosen.has_room:
        return route
    life.meter.fail("overloaded")
    raise APIError(
        429,
        f"both backends are at their admission limit ({route.value} was chosen)",
        code="overloaded",
        headers={"Retry-After": "1"},
    )
