"""The request pipeline: read, analyse, live state, decide, dispatch, settle.

`generate` runs one request the whole way for the standalone gateway's routed
endpoints (gateway/api/v1.py). The Envoy picker (gateway/extproc/stream.py)
runs the same stages in Envoy's order (analyse, live_state, route_override,
ask_for_usage, settle) and /decide (gateway/api/decide.py) the first three, so all
three read, decide and learn alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable
from typing import Any

import structlog
from aiohttp import web

from classifier.features import Endpoint, FeatureOptions, RequestFeatures, extract_features
from classifier.tokens import TokenCounter
from classifier.types import Decision, LiveState, Route
from gateway.backends.live import for_decision
from gateway.backends.models import ModelFilter
from gateway.config import Config
from gateway.errors import LOGGED, APIError, draining, request_id
from gateway.outcomes.accounting import count_request, log_request
from gateway.outcomes.learning import learn, predicted_header
from gateway.outcomes.outcome_log import outcome_line
from gateway.request import responses
from gateway.request.dispatch import ANSWERED_BY, ROUTE_HEADER, Routed, alternatives, dispatch
from gateway.request.targets import predicted_header as slo_header
from gateway.request.targets import with_targets
from gateway.runtime import Snapshot
from gateway.state import (
    BACKENDS,
    BIG_BODIES,
    BIG_BODY_RATE,
    METRICS,
    OUTCOME_LOG,
    RECORDER,
    RNG,
    RUNTIME,
    SHADOWS,
    TOKENS,
)
from gateway.wire.life import CLIENT_DISCONNECT, RequestLife, RequestRecord
from gateway.wire.proxy import read_chat_events
from gateway.wire.tracing import TRACING, annotate, carried, log_fields
from gateway.wire.validation import parse_body, with_member

_BIG_BODY = 256 * 1024  # parsing and reading it take a millisecond or more
MODEL_FALLBACK = "model-fallback"  # the reason, when the policy's route lacked the model
# The side-by-side page (gateway/ui) marks its own requests: a route it forces has the
# reason "ui", so that clicks on the page do not count as clients' "override" traffic.
CLIENT_HEADER = "x-specroute-client"
PAGE = "ui"
_JSON_TYPES = ("application/json", "application/octet-stream")


async def generate(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    """One request, the whole way: read and analyse it, decide its route in its
    pair, dispatch it, and settle its record whatever happens (cancellation too)."""
    app = request.app
    snapshot = app[RUNTIME].current  # one config for the whole request, whatever reloads
    config = snapshot.config
    life = RequestLife.start(request_id(request), endpoint, carried(request))
    request[LOGGED] = True  # the line below is this request's log line
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(
        request_id=life.request_id, endpoint=endpoint.value, **log_fields(life.trace)
    )
    try:
        if app[RUNTIME].draining:
            raise draining()
        raw, body, features = await read_and_analyse(request, endpoint, config)
        features = with_targets(features, request.headers, body, config)
        # The recorder's redaction knows chat and completions prompts, not `input`.
        recorder = app.get(RECORDER) if endpoint is not Endpoint.RESPONSES else None
        if recorder is not None:
            recorder.offer(body, endpoint.value, life.meter.started, features.workload.value)
        served = ModelFilter.of(app[BACKENDS], body)
        pair, state = live_state(app, served)
        owner = await _stored_owner(request, body, endpoint)
        if owner is not None:  # only the server that stored it can continue it
            pair = owner.upstream.pair
            state = app[BACKENDS].live_state(pair)
            decision = Decision(route=owner.route, reason="stored_response")
        else:
            headers = request.headers
            forced = route_override(headers.get(ROUTE_HEADER), config, headers.get(CLIENT_HEADER))
            decision = forced or steer_to_model(
                snapshot.policy.decide(features, state, app[RNG]), served, config.routes
            )
        life.decided(body, features, decision, state, pair)
        raw, strip_usage = ask_for_usage(body, raw, endpoint)
        routed = Routed(
            decision.route,
            decision.reason,
            raw,
            strip_usage,
            life.request_id,
            predicted_header(decision),
            features.prompt_tokens if features.stream else 0,
            pair,
            pinned=owner.upstream if owner else None,
            read_events=(
                responses.read_events if endpoint is Endpoint.RESPONSES else read_chat_events
            ),
            alternatives=failover_routes(decision, served, config.routes),
            slo=slo_header(features, decision),
        )
        answer = await dispatch(request, routed, life, config)
        if endpoint is Endpoint.RESPONSES and (answered_by := request.get(ANSWERED_BY)):
            responses.remember(app, life.meter.report, answered_by)
        return answer
    except (APIError, web.HTTPException) as exc:
        life.meter.status = exc.status
        raise
    except asyncio.CancelledError:
        life.meter.fail(CLIENT_DISCONNECT)
        raise
    finally:
        settle(app, snapshot, life)


def live_state(app: web.Application, served: ModelFilter | None = None) -> tuple[int, LiveState]:
    """The GPU pair a request goes to, and that pair's live state as the policy reads
    it (the pair first, then the route within it): gateway/backends/live.py builds it.
    With the request's ModelFilter, the routes that lack its model are unavailable."""
    pair, state = for_decision(app[BACKENDS], app[SHADOWS])
    return pair, served.state(state) if served is not None else state


def steer_to_model(decision: Decision, served: ModelFilter, routes: Iterable[Route]) -> Decision:
    """The policy's decision, unless its route lacks the request's model (a policy that
    reads no health, or every route that has it down): then the best route that has it."""
    if decision.route not in served.lacking:
        return decision
    best = alternatives(decision, served.serving(routes))[0]
    return dataclasses.replace(decision, route=best, reason=MODEL_FALLBACK)


def failover_routes(
    decision: Decision, served: ModelFilter, routes: Iterable[Route]
) -> tuple[Route, ...]:
    """Where a failover may go: the routes that serve the model, the predicted cheapest
    first (none: the decision's route again, never one that answers 404)."""
    return alternatives(decision, served.serving(routes)) or (decision.route,)


def settle(app: web.Application, snapshot: Snapshot, life: RequestLife) -> None:
    """A request ended, any way: freeze its record, and hand it to its four readers
    (metrics, the log line, learning, the outcome log), then to the shadows. The
    standalone gateway and the Envoy picker (gateway/extproc) both end requests here."""
    config = snapshot.config
    sources = app[BACKENDS].sources
    ks = {route: c.num_speculative_tokens for route, c in config.routes.items()}
    record = life.close(ks, sources.attributed_rate)
    sources.saw_answer(record.spec_metrics)
    annotate(app.get(TRACING), record, life.meter.report)  # the request's span, if traced
    count_request(app[METRICS], record)
    log_request(record)
    learn(snapshot.policy, app[METRICS], record)
    if (outcomes := app.get(OUTCOME_LOG)) is not None:
        line = outcome_line(record, include_prompt=config.outcome_log.include_prompts)
        if line is not None:
            outcomes.write(line)
    app[SHADOWS].offer(_shadowable(record))  # maybe a copy to the other route, in idle time


def _shadowable(record: RequestRecord) -> RequestRecord:
    """The record as the shadows see it. A Responses request is never copied (the copy
    would force max_tokens, which that API names max_output_tokens, and store a response
    on the other server): without its decision it is only the server's activity."""
    if record.endpoint is Endpoint.RESPONSES:
        return dataclasses.replace(record, decision=None)
    return record


async def _stored_owner(
    request: web.Request, body: dict[str, Any], endpoint: Endpoint
) -> responses.Owner | None:
    """The server that stored the response this request continues, if any knows it."""
    previous = body.get("previous_response_id") if endpoint is Endpoint.RESPONSES else None
    return await responses.owner_of(request.app, previous) if previous else None


async def read_and_analyse(
    request: web.Request, endpoint: Endpoint, config: Config
) -> tuple[bytes, dict[str, Any], RequestFeatures]:
    """The body, parsed, validated, and its features.

    A big body (milliseconds to read, parse and forward) first draws from the
    byte-rate budget (gateway/wire/limits.py), then is read and parsed one at a time, in
    a thread: a flood of them waits in TCP's flow control, not in this process, and
    the event loop (and /health) keeps most of it.
    """
    app, timeout_s = request.app, config.server.body_read_timeout_s
    # A small declared body is read now; a big one (declared, or chunked and found
    # big once read) waits for the budget first.
    raw = b""
    if (request.content_length or 0) < _BIG_BODY:
        raw = await _read_json_body(request, timeout_s)
        if len(raw) < _BIG_BODY:
            return raw, *analyse(raw, endpoint, app[TOKENS], config.routing.features)
    await app[BIG_BODY_RATE].take(len(raw) or request.content_length or 0)
    async with app[BIG_BODIES]:
        raw = raw or await _read_json_body(request, timeout_s)
        body, features = await asyncio.to_thread(
            analyse, raw, endpoint, app[TOKENS], config.routing.features
        )
    return raw, body, features


def analyse(
    raw: bytes, endpoint: Endpoint, tokens: TokenCounter, options: FeatureOptions
) -> tuple[dict[str, Any], RequestFeatures]:
    body = parse_body(raw, endpoint)
    return body, extract_features(body, endpoint, tokens, options)


async def _read_json_body(request: web.Request, timeout_s: float) -> bytes:
    if request.content_type not in _JSON_TYPES and not request.content_type.endswith("+json"):
        raise APIError(
            415, f"unsupported content type {request.content_type!r}: send application/json"
        )
    if request.content.is_eof():  # all in with the headers: no timer to arm and cancel
        return await request.read()
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise APIError(408, f"request body not received within {timeout_s:g} s") from None


def route_override(
    wanted: str | None, config: Config, client: str | None = None
) -> Decision | None:
    """The route the client forced with x-specroute-route, if the config allows it:
    reason "override", or "ui" for the page's own (x-specroute-client: ui)."""
    if wanted is None or not config.server.allow_route_override:
        return None
    name = wanted.strip().lower()
    for route in config.routes:
        if route == name:
            return Decision(route=route, reason=PAGE if client == PAGE else "override")
    names = ", ".join(f"'{r.value}'" for r in config.routes)
    raise APIError(400, f"{ROUTE_HEADER} must name a route: one of {names}", param=ROUTE_HEADER)


def ask_for_usage(body: dict[str, Any], raw: bytes, endpoint: Endpoint) -> tuple[bytes, bool]:
    """Make a stream report its usage; return the body to send and whether to strip it.

    vLLM reports token counts (and per-request speculative metrics) in a final
    usage chunk only when asked. The gateway needs them to measure, so it asks (at
    the end of the client's bytes, never in a re-serialised body: with_member); if
    the client did not, that chunk is removed again on the way back. A Responses
    stream always has its usage, in response.completed.
    """
    if not body.get("stream") or endpoint is Endpoint.RESPONSES:
        return raw, False
    options = body.get("stream_options") or {}
    if options.get("include_usage"):
        return raw, False
    patched = {**options, "include_usage": True}
    if options.get("continuous_usage_stats"):
        # vLLM honours it only with include_usage: without, the client gets no
        # usage anywhere, so the stream must not start carrying it per event.
        patched["continuous_usage_stats"] = False
    return with_member(raw, "stream_options", patched), True
