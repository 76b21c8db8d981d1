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
from gateway.proxy import Exchange, Target, UpstreamFailure, failure_response, open_upstream, relay
from gateway.state import BACKENDS, SESSION

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


class _FailOver:
    """Returned by the first attempt when the other backend should answer."""


async def dispatch(
    request: web.Request, routed: Routed, exchange: Exchange, config: Config
) -> web.StreamResponse:
    pool = request.app[BACKENDS]
    route = _admit(pool, config, routed.route, exchange)
    answer = await _attempt(request, routed, exchange, config, route, may_retry=True)
    if isinstance(answer, web.StreamResponse):
        return answer
    exchange.failover_from = route
    try:
        retried = await _attempt(request, routed, exchange, config, route.other, may_retry=False)
    finally:
        pool.release_retry()
    assert isinstance(retried, web.StreamResponse)
    return retried


async def _attempt(
    request: web.Request,
    routed: Routed,
    exchange: Exchange,
    config: Config,
    route: Route,
    *,
    may_retry: bool,
) -> web.StreamResponse | _FailOver:
    app = request.app
    pool = app[BACKENDS]
    backend = pool.of(route)
    upstream = backend.pick()
    exchange.route = route
    headers = {
        ROUTE_HEADER: route.value,
        REASON_HEADER: routed.reason,
        "X-Request-Id": routed.request_id,
    }
    if exchange.failover_from is not None:
        headers[FAILOVER_HEADER] = exchange.failover_from.value
    if routed.predicted is not None:
        headers[PREDICTED_HEADER] = routed.predicted
    with pool.track(backend, upstream, routed.prefill_tokens) as prefilled:
        exchange.on_first_token = prefilled
        exchange.batch = backend.inflight
        try:
            response = await open_upstream(
                request,
                app[SESSION],
                Target(upstream.url, route.value, backend.headers),
                routed.body,
                connect_timeout_s=config.upstream.connect_timeout_s,
                read_timeout_s=config.upstream.read_timeout_s,
            )
        except UpstreamFailure as failure:
            pool.report_failure(backend, upstream, failure.kind)
            if failure.retryable and may_retry and _retry_allowed(pool, config, route):
                return _FailOver()
            return failure_response(exchange, failure, headers)
        if response.status >= 500 and may_retry and _retry_allowed(pool, config, route):
            response.close()
            pool.report_failure(backend, upstream, "http_5xx")
            return _FailOver()
        answer = await relay(
            request,
            response,
            exchange,
            name=route.value,
            response_headers=headers,
            strip_usage_chunk=routed.strip_usage_chunk,
        )
    if exchange.error_kind in _RELAY_FAILURES:
        pool.report_failure(backend, upstream, exchange.error_kind or "")
    elif exchange.error_kind is None:
        pool.report_success(upstream)
    return answer


def _retry_allowed(pool: BackendPool, config: Config, route: Route) -> bool:
    """Fail over if enabled, the other backend can take it, and the budget allows."""
    other = pool.of(route.other)
    if not (config.upstream.failover and other.healthy and other.has_room):
        return False
    upstream = config.upstream
    return pool.try_acquire_retry(upstream.retry_budget_ratio, upstream.retry_budget_min)


def _admit(pool: BackendPool, config: Config, route: Route, exchange: Exchange) -> Route:
    """The admission limit: the chosen backend if it has room, else the other, else 429."""
    if pool.of(route).has_room:
        return route
    if config.upstream.failover and pool.of(route.other).has_room:
        exchange.failover_from = route
        return route.other
    exchange.error_kind = "overloaded"
    raise APIError(
        429,
        f"both backends are at their admission limit ({route.value} was chosen)",
        code="overloaded",
        headers={"Retry-After": "1"},
    )
