"""One HTTP request as Envoy's ext_proc filter shows it to the picker: one gRPC stream.

The messages come in the request's order: request headers, the request body
(BUFFERED: whole, in one message; FULL_DUPLEX_STREAMED: in pieces, answered once
the last is in), response headers, the response body (STREAMED or
FULL_DUPLEX_STREAMED: as it passes). The stream is the request's life:

- request body: parse, validate and take the features exactly as `serve` does
  (gateway/request/pipeline.py), decide, and tell Envoy where to go: pool mode sets
  `x-specroute-route` and clears the route cache, endpoint mode names the server
  (GIE's `x-gateway-destination-endpoint`, header and `envoy.lb` metadata). A
  stream gets `include_usage` added (the body mutation), as `serve` adds it.
- response headers: which server answered (Envoy's `upstream.address`
  attribute), its status, and the same `x-specroute-*` headers `serve` sends.
- response body: first token, usage and vLLM's per-request metrics, read by the
  standalone gateway's own readers; the usage chunk the picker asked for is cut.
- end (normal, or Envoy resetting the stream): the in-flight count is released
  and the record goes to the same four readers and the shadows
  (`pipeline.settle`).

Bad input gets the gateway's 4xx in OpenAI's shape as an ImmediateResponse.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from typing import Any

import structlog
from aiohttp import web

from classifier.features import Endpoint, RequestFeatures
from gateway.backends.models import ModelFilter
from gateway.backends.pool import Upstream
from gateway.errors import APIError, draining, request_id_of, sse_error_event
from gateway.extproc import messages
from gateway.extproc.pb import ext_proc_subset_pb2 as pb
from gateway.outcomes.learning import predicted_header
from gateway.request.dispatch import (
    FAILOVER_HEADER,
    PREDICTED_HEADER,
    REASON_HEADER,
    ROUTE_HEADER,
    SLO_HEADER,
    Routed,
    admit,
)
from gateway.request.pipeline import (
    analyse,
    ask_for_usage,
    failover_routes,
    live_state,
    route_override,
    settle,
    steer_to_model,
)
from gateway.request.targets import predicted_header as slo_header
from gateway.request.targets import with_targets
from gateway.state import BACKENDS, BIG_BODIES, RNG, RUNTIME, SHADOWS, TOKENS
from gateway.wire.failures import upstream_failure
from gateway.wire.life import STREAM_RESET, RequestLife
from gateway.wire.proxy import AnswerBounds, loads_object, read_chat_events, usage_in
from gateway.wire.sse import EventCutter, EventTooLong
from gateway.wire.tracing import forwarded

ENDPOINT_HEADER = "x-gateway-destination-endpoint"
_PATHS = {"/v1/chat/completions": Endpoint.CHAT, "/v1/completions": Endpoint.COMPLETIONS}
_JSON_TYPES = ("application/json", "application/octet-stream")
_BIG_BODY = 256 * 1024  # parsed in a worker thread, one at a time, as `serve` does
_EVENT_END = b"\n\n"
_FULL_DUPLEX = pb.ProcessingMode.FULL_DUPLEX_STREAMED
_STREAMED_CHUNK = 62_000  # GIE's chunk size for streamed body mutations (Envoy's limit: 64 KiB)
_RELAY_FAILURES = ("http_5xx", "upstream_error_event", "upstream_malformed")


class Mode(enum.StrEnum):
    POOL = "pool"  # set x-specroute-route; Envoy's route table picks the cluster
    ENDPOINT = "endpoint"  # name the server (GIE's endpoint picker protocol)


def host_port(url: str) -> str:
    """`http://10.0.0.5:8001` -> `10.0.0.5:8001`, the form Envoy reports and reads."""
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0]


class PickerStream:
    """The picker's side of one request. `on` answers each message Envoy sends."""

    def __init__(self, app: web.Application, mode: Mode) -> None:
        self.app, self.mode = app, mode
        self.snapshot = app[RUNTIME].current  # one config for the whole request
        self.life: RequestLife | None = None
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self._duplex_request = self._duplex_response = False
        self._strip = False
        self._events: EventCutter | None = None  # an SSE answer's events, cut as they pass
        self._cut_off = False  # an event went over the bound: the rest is dropped
        self._whole = bytearray()  # a whole answer, read for its usage
        self._upstream: Upstream | None = None
        self._answer_headers: dict[str, str] = {}
        self._ended = False  # the answer was answered (body end, or an immediate response)
        self._inflight = contextlib.ExitStack()

    async def on(self, message: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        kind = message.WhichOneof("request")
        if message.HasField("protocol_config"):
            config = message.protocol_config
            self._duplex_request = config.request_body_mode == _FULL_DUPLEX
            self._duplex_response = config.response_body_mode == _FULL_DUPLEX
        if kind == "request_headers":
            return self._request_headers(message.request_headers)
        if kind == "request_body":
            return await self._request_body(message.request_body)
        if kind == "response_headers":
            return [self._response_headers(message)]
        if kind == "response_body":
            return self._response_body(message.response_body)
        return [messages.trailers_reply(request=kind == "request_trailers")]

    def close(self) -> None:
        """The stream ended. Normally the answer ended first and this does nothing; a
        stream Envoy reset (client gone, backend broke) ends the request here."""
        if self.life is not None and self.life.meter.error_kind is None:
            self.life.meter.fail(STREAM_RESET)
        self._finish()

    def _finish(self) -> None:
        """The request is over: release its in-flight count and settle its record,
        before the reply that carries its last byte goes back to Envoy."""
        life, self.life = self.life, None
        if life is None:
            return
        self._ended = True
        life.meter.finish()
        self._inflight.close()
        settle(self.app, self.snapshot, life)

    # ---- the request ---------------------------------------------------------------

    def _request_headers(self, message: pb.HttpHeaders) -> list[pb.ProcessingResponse]:
        self._headers = headers = messages.headers_of(message)
        endpoint = None
        if headers.get(":method") == "POST":
            endpoint = _PATHS.get(headers.get(":path", "").split("?", 1)[0])
        if endpoint is None:  # not routed: Envoy's default route takes it, unread
            return [messages.unrouted_reply()]
        self.life = life = RequestLife.start(
            request_id_of({"X-Request-Id": headers.get("x-request-id", "")}),
            endpoint,
            forwarded(headers),  # Envoy forwards them itself; a shadow copy carries them on
        )
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=life.request_id, endpoint=endpoint.value)
        try:
            self._check_headers(headers)
        except APIError as exc:
            return [self._refuse(exc)]
        if message.end_of_stream:  # no body at all: refused as `serve` refuses it
            return [self._refuse(APIError(400, "request body is not valid JSON: empty body"))]
        if self._duplex_request:
            return []  # the headers are answered with the decision, once the body is in
        return [messages.request_headers_reply()]

    def _check_headers(self, headers: dict[str, str]) -> None:
        if self.app[RUNTIME].draining:
            raise draining()
        kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind not in _JSON_TYPES and not kind.endswith("+json"):
            raise APIError(415, f"unsupported content type {kind!r}: send application/json")
        limit = self.snapshot.config.server.max_body_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"request body over {limit} bytes")

    async def _request_body(self, message: pb.HttpBody) -> list[pb.ProcessingResponse]:
        life = self.life
        if life is None or self._ended:
            return [messages.request_body_reply()]
        self._body += message.body
        limit = self.snapshot.config.server.max_body_bytes
        if len(self._body) > limit:
            return [self._refuse(APIError(413, f"request body over {limit} bytes"))]
        if not message.end_of_stream:
            if self._duplex_request:
                return []  # more to come; nothing goes on until it is all in
            return [messages.request_body_reply()]
        try:
            return await self._decide(life, bytes(self._body))
        except APIError as exc:
            return [self._refuse(exc)]

    async def _decide(self, life: RequestLife, raw: bytes) -> list[pb.ProcessingResponse]:
        app, config = self.app, self.snapshot.config
        body, features = await self._analyse(raw, life.endpoint)
        features = with_targets(features, self._headers, body, config)
        served = ModelFilter.of(app[BACKENDS], body)  # no route has the model: vLLM's 404
        pair, state = live_state(app, served)
        forced = route_override(self._headers.get(ROUTE_HEADER), config)
        decision = forced or steer_to_model(
            self.snapshot.policy.decide(features, state, app[RNG]), served, config.routes
        )
        life.decided(body, features, decision, state, pair)
        sent, strip = ask_for_usage(body, raw, life.endpoint)
        self._strip = strip
        predicted = predicted_header(decision)
        routed = Routed(
            decision.route,
            decision.reason,
            sent,
            strip,
            life.request_id,
            predicted,
            alternatives=failover_routes(decision, served, config.routes),
        )
        pool = app[BACKENDS]
        route = admit(pool, config, routed, life)
        upstream = self._track(route, pair, features)
        self._answer_headers = {
            ROUTE_HEADER: route.value,
            REASON_HEADER: decision.reason,
            "x-request-id": life.request_id,
            **({PREDICTED_HEADER: predicted} if predicted else {}),
        }
        if (slo := slo_header(features, decision)) is not None:
            self._answer_headers[SLO_HEADER] = slo
        to_backend = {"x-request-id": life.request_id, **pool.of(route).headers}
        metadata = None
        if self.mode is Mode.POOL:
            to_backend[ROUTE_HEADER] = route.value
        else:
            to_backend[ENDPOINT_HEADER] = host_port(upstream.url)
            metadata = messages.lb_metadata({ENDPOINT_HEADER: host_port(upstream.url)})
        changed = sent if strip else None
        if changed is not None:
            to_backend["content-length"] = str(len(changed))
        # The client's Authorization never reaches a backend (as with `serve`).
        remove = ["authorization"] if "authorization" in self._headers else []
        if not self._duplex_request:
            reply = messages.common(to_backend, remove=remove, body=changed, clear_route_cache=True)
            return [messages.request_body_reply(reply, metadata)]
        headers = messages.common(to_backend, remove=remove, clear_route_cache=True)
        first = messages.request_headers_reply(headers)
        if metadata is not None:
            first.dynamic_metadata.CopyFrom(metadata)
        return [first, *_streamed(sent, request=True, end=True)]

    async def _analyse(
        self, raw: bytes, endpoint: Endpoint
    ) -> tuple[dict[str, Any], RequestFeatures]:
        app, options = self.app, self.snapshot.config.routing.features
        if len(raw) < _BIG_BODY:
            return analyse(raw, endpoint, app[TOKENS], options)
        async with app[BIG_BODIES]:
            return await asyncio.to_thread(analyse, raw, endpoint, app[TOKENS], options)

    def _track(self, route: Any, pair: int, features: RequestFeatures) -> Upstream:
        """Count the request in flight on the server it goes to until the stream ends."""
        assert self.life is not None
        pool = self.app[BACKENDS]
        upstream = pool.pick(route, pair)
        self.app[SHADOWS].user_arrived(upstream)  # a shadow there gives way now
        prefill = features.prompt_tokens if features.stream else 0
        tracked = pool.track(pool.of(route), upstream, prefill, features)
        self.life.meter.on_first_token = self._inflight.enter_context(tracked)
        self.life.sent_to(route, pool.batch(route, upstream))
        self._upstream = upstream
        return upstream

    def _refuse(self, error: APIError) -> pb.ProcessingResponse:
        assert self.life is not None
        self.life.meter.status = error.status
        reply = messages.immediate(error, {"x-request-id": self.life.request_id})
        self._finish()
        return reply

    # ---- the answer ----------------------------------------------------------------

    def _response_headers(self, message: pb.ProcessingRequest) -> pb.ProcessingResponse:
        life = self.life
        if life is None or self._ended:
            return messages.response_headers_reply()
        headers = messages.headers_of(message.response_headers)
        status = headers.get(":status", "0")
        life.meter.status = int(status) if status.isdigit() else 0
        self._note_who_answered(life, message)
        kind = headers.get("content-type", "")
        if life.meter.status == 200 and kind.startswith("text/event-stream"):
            self._events = EventCutter(AnswerBounds.of(self.snapshot.config).max_event_bytes)
        if life.failover_from is not None:
            self._answer_headers[FAILOVER_HEADER] = life.failover_from.value
        reply = messages.common(self._answer_headers)
        if message.response_headers.end_of_stream:
            self._answered()
        elif life.meter.status != 200:
            # An error's body tells the picker nothing (a 5xx counts by its status): it is
            # not sent to the picker, and the request ends with its headers.
            if life.meter.status >= 500:
                life.meter.fail("http_5xx")
            self._answered()
            return messages.bodiless_answer_reply(reply)
        return messages.response_headers_reply(reply)

    def _note_who_answered(self, life: RequestLife, message: pb.ProcessingRequest) -> None:
        """Envoy may have failed over (a retry on another route: each route's cluster holds
        the other routes' servers at priority 1): believe its report."""
        served = messages.served_endpoint(message) or messages.attribute(
            message, "upstream.address"
        )
        if not served or life.route is None:
            return
        pool = self.app[BACKENDS]
        for backend in pool:
            for upstream in backend.upstreams:
                if host_port(upstream.url) == served.split(",", 1)[0]:
                    if backend.route != life.route:
                        life.failed_over(life.route)
                        life.sent_to(backend.route, pool.batch(backend.route, upstream))
                        self._answer_headers[ROUTE_HEADER] = backend.route.value
                    self._upstream = upstream
                    return

    def _response_body(self, message: pb.HttpBody) -> list[pb.ProcessingResponse]:
        life = self.life
        if life is None or self._ended:
            return self._pass_body(message.body, message.end_of_stream)
        meter, chunk, end = life.meter, message.body, message.end_of_stream
        if self._events is None:
            self._whole += chunk
            meter.bytes_sent += len(chunk)
            if end:
                self._read_whole()
            return self._pass_body(chunk, end)
        out = self._read_events(self._events, chunk)
        if end and out is not None and not self._cut_off:
            out += self._events.rest()  # what came after the last whole event
        meter.bytes_sent += len(chunk if out is None else out)
        if end:
            self._answered()
        if out is None:  # nothing cut: the bytes pass as Envoy has them
            return self._pass_body(chunk, end)
        if self._duplex_response:
            return _streamed(out, request=False, end=end)
        return [messages.response_body_reply(messages.common(body=out))]

    def _read_events(self, events: EventCutter, chunk: bytes) -> bytes | None:
        """Read the events `chunk` completes; the bytes to send instead of it, or None
        to let it pass. Each byte is looked at once (EventCutter): a stream without a
        blank line costs its length, not its square. An event over the bound ends the
        stream as the standalone gateway's relay ends it: the backend failed
        (upstream_malformed), the client gets the error event, and nothing after it."""
        assert self.life is not None
        if self._cut_off:
            return b""
        meter = self.life.meter
        try:
            out = read_chat_events(events.feed(chunk), meter, self._strip)
        except EventTooLong as exc:
            self._cut_off = True
            route = self.life.route.value if self.life.route is not None else "?"
            failure = upstream_failure(exc, route, answered=True)
            meter.fail(failure.kind)
            error = sse_error_event(
                f"backend stream interrupted: {failure.message}", code=failure.kind
            )
            # Unless stripping, the event's first bytes passed already: end it first.
            return error if self._strip else _EVENT_END + error
        return out if self._strip else None

    def _pass_body(self, chunk: bytes, end: bool) -> list[pb.ProcessingResponse]:
        """The chunk unchanged: CONTINUE, or (full duplex) the same bytes sent back."""
        if not self._duplex_response:
            return [messages.response_body_reply()]
        return _streamed(chunk, request=False, end=end)

    def _read_whole(self) -> None:
        """A whole answer ended: its usage and vLLM's metrics, as `serve` reads them."""
        assert self.life is not None
        meter = self.life.meter
        if meter.status == 200:
            meter.report = loads_object(bytes(self._whole))
            if meter.report is not None:
                meter.usage = usage_in(meter.report) or meter.usage
        elif meter.status >= 500:
            meter.fail("http_5xx")
        self._whole.clear()
        self._answered()

    def _answered(self) -> None:
        """The answer's last byte is passing: the request is done."""
        assert self.life is not None
        pool, upstream, route = self.app[BACKENDS], self._upstream, self.life.route
        kind = self.life.meter.error_kind
        if upstream is not None and route is not None:
            if kind in _RELAY_FAILURES:
                pool.report_failure(pool.of(route), upstream, kind or "")
            elif kind is None:
                pool.report_success(upstream)
        self._finish()


def _streamed(data: bytes, *, request: bool, end: bool) -> list[pb.ProcessingResponse]:
    """Bytes as FULL_DUPLEX_STREAMED mutations: chunks under Envoy's 64 KiB, the last
    one ending the body when `end`."""
    step = _STREAMED_CHUNK
    pieces = [data[i : i + step] for i in range(0, len(data), step)] or [b""]
    replies = []
    for i, piece in enumerate(pieces):
        common = pb.CommonResponse()
        last = end and i == len(pieces) - 1
        common.body_mutation.streamed_response.CopyFrom(
            pb.StreamedBodyResponse(body=piece, end_of_stream=last)
        )
        replies.append(
            messages.request_body_reply(common) if request else messages.response_body_reply(common)
        )
    return replies
