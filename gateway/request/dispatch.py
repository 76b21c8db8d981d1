"""Send a routed request to a backend, failing over to the other one when that is safe.

Both backends serve the same model, so each is the other's fallback. A
failure before the client received a byte (connection refused, connect
timeout, a 5xx status) is retried once on the other backend, within a retry
budget; a 4xx is the client's problem and is relayed, and once bytes have
been sent nothing is retried (the client would see a spliced answer).

Every attempt goes to the decided pair's endpoint of its route (backends.pairs:
the servers on one GPU), and to another healthy endpoint of that route only
when the pair's is not healthy: failover tries the other route within the
pair first.

A request that names a stored response (the Responses API's previous_response_id)
is pinned to the server that stored it: only that one can answer it, so it is
neither moved to another endpoint nor failed over.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp import web

from classifier.types import Decision, Route
from gateway.backends.pool import Backend, BackendPool, Upstream
from gateway.config import Config
from gateway.errors import APIError
from gateway.state import BACKENDS, RELAYS, SESSION, SHADOWS
from gateway.wire.failures import UpstreamFailure
from gateway.wire.life import ANSWER_FAILURES, RequestLife
from gateway.wire.proxy import (
    AnswerBounds,
    EventReader,
    Relay,
    Target,
    failure_response,
    open_upstream,
    read_chat_events,
    relay,
)
from gateway.wire.tracing import TRACING, routed_call

ROUTE_HEADER = "x-specroute-route"
REASON_HEADER = "x-specroute-reason"
FAILOVER_HEADER = "x-specroute-failover"
PREDICTED_HEADER = "x-specroute-predicted"
# Whether the route was predicted to meet the request's latency targets (request/targets.py).
SLO_HEADER = "x-specroute-slo-predicted"
_ATTEMPTS = 3
_RELAY_FAILURES = (*ANSWER_FAILURES, "http_5xx")
# The endpoint that answered: the handler remembers it as a stored response's maker.
ANSWERED_BY = web.RequestKey("specroute_answered_by", Upstream)


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
    pair: int = 0  # the GPU pair it was decided for (BackendPool.choose_pair)
    pinned: Upstream | None = None  # the one endpoint that may answer (a stored response's)
    read_events: EventReader = read_chat_events  # what a streamed answer's events say
    # The other routes in the order the decision ranked them (its predictions, cheapest
    # first; without predictions, the configuration's order): where a failover goes.
    alternatives: tuple[Route, ...] = ()
    # Whether its route was predicted to meet its latency targets (None: it has none).
    slo: str | None = None


def alternatives(decision: Decision, routes: Iterable[Route]) -> tuple[Route, ...]:
    """The routes other than the decision's, the predicted cheapest first."""
    predicted = decision.predicted_s or {}
    others = [r for r in routes if r != decision.route]
    return tuple(sorted(others, key=lambda r: predicted.get(r, math.inf)))


def _other(pool: BackendPool, routed: Routed, route: Route) -> Route:
    """Where a request leaves `route` for: the decision's route if it is not `route`
    (a third attempt returns there), else the best alternative with room and health,
    else the best alternative."""
    if route != routed.route:
        return routed.route
    ranked = routed.alternatives or tuple(b.route for b in pool if b.route != route)
    usable = [r for r in ranked if pool.of(r).healthy and pool.of(r).has_room]
    return (usable or list(ranked) or [route])[0]


@dataclass(frozen=True, slots=True)
class _FailOver:
    """Returned by an attempt when the other backend should answer.

    budgeted: the move took a slot of the retry budget (a sick backend's 5xx
    or timeout). Moving away from a backend that refused the connection is
    not a retry: it is down, and the same model answers on the other one.
    """

    budgeted: bool
    dead: bool = False  # the backend was down (refused, dropped): it may be back soon


async def dispatch(
    request: web.Request, routed: Routed, life: RequestLife, config: Config
) -> web.StreamResponse:
    """Up to three attempts, A, B, then A again when a backend was down (not sick):
    one that died under a request may be back (restarted), or one that was sick a
    moment ago may answer now, when its stand-in dies too."""
    pool = request.app[BACKENDS]
    route = admit(pool, config, routed, life)
    budget_slots = 0
    first_dead = False
    try:
        for attempt in range(_ATTEMPTS):
            retry = _Retry.NONE if routed.pinned else _retry_mode(attempt, first_dead)
            answer = await _attempt(request, routed, life, config, route, retry)
            if isinstance(answer, web.StreamResponse):
                return answer
            first_dead = first_dead or (attempt == 0 and answer.dead)
            budget_slots += answer.budgeted
            life.failed_over(route)
            route = _other(pool, routed, route)
    finally:
        for _ in range(budget_slots):
            pool.release_retry()
    raise AssertionError("the last attempt always answers")  # pragma: no cover


def _retry_mode(attempt: int, first_dead: bool) -> _Retry:
    """The first attempt may hand on any failure; the second, any if the first backend
    was down, else only its own death; the third answers whatever happens."""
    if attempt == 0 or (attempt == 1 and first_dead):
        return _Retry.ANY
    return _Retry.WHEN_DEAD if attempt == 1 else _Retry.NONE


class _Retry(enum.Enum):
    """What an attempt may hand on to the other backend instead of answering."""

    ANY = "any"  # a down or a sick backend's failure
    WHEN_DEAD = "when_dead"  # only a down one's (refused, dropped before an answer)
    NONE = "none"


async def _attempt(
    request: web.Request,
    routed: Routed,
    life: RequestLife,
    config: Config,
    route: Route,
    retry: _Retry,
) -> web.StreamResponse | _FailOver:
    app = request.app
    pool = app[BACKENDS]
    backend = pool.of(route)
    upstream = routed.pinned or pool.pick(route, routed.pair)
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
    if routed.slo is not None:
        headers[SLO_HEADER] = routed.slo
    app[SHADOWS].user_arrived(upstream)  # a shadow there gives way now
    tracked = pool.track(backend, upstream, routed.prefill_tokens, life.features)
    url = upstream.url + request.path
    call = routed_call(app.get(TRACING), life, route.value, url)  # its span, if tracing is on
    with tracked as prefilled, app[RELAYS].running(), call as traced:
        meter.on_first_token = prefilled
        life.sent_to(route, pool.batch(route, upstream))
        try:
            response = await open_upstream(
                request,
                app[SESSION],
                # the trace headers: this call's span's, replacing the client's
                Target(
                    upstream.url, route.value, backend.headers | traced.headers, routed.request_id
                ),
                routed.body,
                connect_timeout_s=config.upstream.connect_timeout_s,
                read_timeout_s=config.upstream.read_timeout_s,
            )
            traced.answered(response.status)
            sick = response.status >= 500 and retry is _Retry.ANY
            other = _other(pool, routed, route)
            if sick and (move := _retry(pool, config, other, routed.pair)):
                response.close()
                pool.report_failure(backend, upstream, "http_5xx")
                return move
            request[ANSWERED_BY] = upstream
            how = Relay(
                route.value,
                headers,
                routed.strip_usage_chunk,
                routed.read_events,
                AnswerBounds.of(config),
            )
            answer = await relay(request, response, meter, how)
        except UpstreamFailure as failure:  # nothing reached the client
            traced.failed(failure.kind)
            note_failure(pool, backend, upstream, failure)
            move = _move_after(pool, config, routed, route, failure, retry)
            return move or failure_response(meter, failure, headers)
    if meter.error_kind in _RELAY_FAILURES:
        pool.report_failure(backend, upstream, meter.error_kind or "")
    elif meter.error_kind is None:
        pool.report_success(upstream)
    return answer


def note_failure(
    pool: BackendPool, backend: Backend, upstream: Upstream, failure: UpstreamFailure
) -> None:
    """Count a backend's failure; one that refused the connection leaves rotation now.
    A drain is the gateway's doing, not the backend's."""
    if failure.refused:
        pool.report_refused(backend, upstream, failure.kind)
    elif failure.kind != "drained":
        pool.report_failure(backend, upstream, failure.kind)


def _move_after(
    pool: BackendPool,
    config: Config,
    routed: Routed,
    route: Route,
    failure: UpstreamFailure,
    retry: _Retry,
) -> _FailOver | None:
    """Whether another backend answers instead, after a failure before any byte."""
    other = _other(pool, routed, route)
    if failure.dead and retry is not _Retry.NONE and config.upstream.failover:
        # Down (refused, or the connection dropped before an answer): the
        # other backend is tried whatever its state, the attempt is the probe.
        return _FailOver(budgeted=False, dead=True) if pool.of(other).has_room else None
    if failure.retryable and retry is _Retry.ANY:
        return _retry(pool, config, other, routed.pair)
    return None


def _can_take(pool: BackendPool, config: Config, route: Route, *, ejected_too: bool) -> bool:
    """Failover is on and `route` has room and is healthy (or, with ejected_too, at
    least answers its /health: ejected for errors, but better than a dead one)."""
    backend = pool.of(route)
    usable = backend.healthy or (ejected_too and backend.reachable)
    return config.upstream.failover and usable and backend.has_room


def _retry(pool: BackendPool, config: Config, other: Route, pair: int) -> _FailOver | None:
    """Retry a sick backend's failure (5xx, connect timeout) on `other`.

    A healthy other backend with no failures of its own takes it freely: that is
    failover, not a storm. The retry budget bounds retries onto a backend that is
    itself failing, so that a sick pair is not sent twice the load.
    """
    if not _can_take(pool, config, other, ejected_too=False):
        return None
    if pool.of(other).proven(pool.pairs[pair].of(other)):
        return _FailOver(budgeted=False)
    upstream = config.upstream
    if pool.try_acquire_retry(upstream.retry_budget_ratio, upstream.retry_budget_min):
        return _FailOver(budgeted=True)
    return None


def admit(pool: BackendPool, config: Config, routed: Routed, life: RequestLife) -> Route:
    """Where the request goes first: the chosen backend if it is healthy and has room,
    else the other (an override or a static route included), else 429. A pinned
    request goes to its endpoint, healthy or not: no other has what it names."""
    route = routed.route
    chosen = pool.of(route)
    if (chosen.healthy or routed.pinned) and chosen.has_room:
        return route
    other = _other(pool, routed, route)
    if not routed.pinned and (
        _can_take(pool, config, other, ejected_too=False)
        or (not chosen.reachable and _can_take(pool, config, other, ejected_too=True))
    ):
        life.failed_over(route)
        return other
    if chosen.has_room:
        return route
    life.meter.fail("overloaded")
    raise APIError(
        429,
        f"the backends are at their admission limit ({route.value} was chosen)",
        code="overloaded",
        headers={"Retry-After": "1"},
    )
