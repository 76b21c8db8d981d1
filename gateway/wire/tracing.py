"""Trace context through the gateway, and OpenTelemetry spans when OTEL_* turn them on.

Always, with no dependency: a request's W3C `traceparent`, `tracestate` and
`baggage` go on with it to the backend that answers it (routed or passed
through) and with the shadow copy made of it, so vLLM's own spans
(`--otlp-traces-endpoint`) join the client's trace instead of starting one.

With the `otel` extra installed and the standard variables asking for traces
(`exporters_wanted`), the gateway makes its own spans and sends them by
OTLP/HTTP (or prints them, `OTEL_TRACES_EXPORTER=console`):

- a SERVER span per request, the client's span its parent. A routed request's is
  named as the GenAI conventions name an inference ("chat {model}") once its body
  is read, and carries what it asked (`gen_ai.request.*`), what came back
  (`gen_ai.response.*`, `gen_ai.usage.*`) and what specroute decided
  (`specroute.route`, `specroute.reason`, `specroute.predicted_s.<route>`);
- a CLIENT span per call to a backend (each attempt of a failover), child of it:
  the traceparent the backend gets is this span's, so vLLM's spans nest under it;
- a shadow copy's CLIENT span (`specroute.shadow` true) is the root of a trace
  of its own with a link to the request it copies: it runs after that answer,
  in idle time, at no user's expense, so it is no part of what the user waited
  for and does not stretch the user's trace. With tracing off the gateway makes
  no span, and a copy carries the user's headers unchanged (vLLM's span of it is
  then in the user's trace, its request id `<id>-shadow`).

Spans are made here and nowhere else; the AppKey TRACING holds the app's tracer
(none when off, and every helper is then a cheap no-op).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import structlog
from aiohttp import web

from classifier.features import Endpoint
from gateway.wire.life import Meter, RequestLife, RequestRecord

# The otel extra is imported only once OTEL_* turn tracing on: off, the gateway
# forwards the headers and never loads OpenTelemetry.
if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = structlog.get_logger("specroute.tracing")

TRACE_HEADERS = ("traceparent", "tracestate", "baggage")
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
# Polled or probed every few seconds: a span each would bury the requests.
_UNTRACED = ("/health", "/ready", "/metrics", "/stats", "/ui")
_OPERATIONS = {
    Endpoint.CHAT: "chat",
    Endpoint.COMPLETIONS: "text_completion",
    Endpoint.RESPONSES: "chat",
}
PROVIDER = "vllm"  # gen_ai.provider.name: every backend is a vLLM server
_OTLP_PROTOCOL = "http/protobuf"  # the one the otel extra's exporter speaks


def forwarded(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's trace headers, as they came: what goes on with its request."""
    return {name: value for name in TRACE_HEADERS if (value := headers.get(name))}


def trace_id_of(carried: Mapping[str, str]) -> str | None:
    """The trace id a traceparent names (for the request's log line), if it is well formed."""
    match = _TRACEPARENT.match(carried.get("traceparent", ""))
    if match is None or match.group(1) == "0" * 32:
        return None
    return match.group(1)


def log_fields(carried: Mapping[str, str]) -> dict[str, str]:
    """`trace_id` for the request's log lines when it has one, else nothing."""
    trace_id = trace_id_of(carried)
    return {"trace_id": trace_id} if trace_id else {}


def carried(request: web.Request) -> dict[str, str]:
    """The trace context a request carries on (to its shadow copy): its server span's
    when tracing is on, else the client's headers as they came."""
    if _on(request.app.get(TRACING)):
        from opentelemetry import propagate, trace

        if trace.get_current_span().get_span_context().is_valid:
            headers: dict[str, str] = {}
            propagate.inject(headers)
            return headers
    return forwarded(request.headers)


# ---- turned on by OTEL_* --------------------------------------------------------------


def exporters_wanted(env: Mapping[str, str]) -> list[str]:
    """The span exporters the standard variables ask for; [] is tracing off.

    Off unless asked: an OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT` or
    `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) or `OTEL_TRACES_EXPORTER` (otlp, console)
    turns it on; `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true` keeps it off
    whatever else is set. (The SDK's own default exporter is otlp to localhost: a
    gateway sends nothing anywhere unasked.)"""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not named:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    names = [name.strip() for name in named.split(",") if name.strip()]
    return [] if "none" in names else names


@dataclass(frozen=True, slots=True)
class Tracing:
    """The app's tracer and its provider, or neither (tracing off)."""

    tracer: Tracer | None = None
    provider: TracerProvider | None = None


TRACING = web.AppKey("tracing", Tracing)


def _on(tracing: Tracing | None) -> bool:
    return tracing is not None and tracing.tracer is not None


def from_env() -> Tracing:
    """Tracing as the OTEL_* variables set it: the SDK reads the rest of them itself
    (sampler, resource, batch processor, the exporter's endpoint, headers, timeout)."""
    names = exporters_wanted(os.environ)
    if not names:
        return Tracing()
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "tracing_unavailable",
            why="OTEL_* ask for traces but OpenTelemetry is not installed",
            fix="pip install 'specroute[otel]'",
        )
        return Tracing()
    exporters = [e for name in names if (e := _exporter(name)) is not None]
    if not exporters:
        return Tracing()
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "specroute"}))
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing_on", exporters=names, service=resource.attributes.get("service.name"))
    return Tracing(provider.get_tracer("specroute", _version()), provider)


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        log.warning("tracing_exporter_unknown", exporter=name, known="otlp, console, none")
        return None
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", _OTLP_PROTOCOL
    )
    if protocol.strip() != _OTLP_PROTOCOL:
        log.warning("tracing_protocol_unsupported", protocol=protocol, supported=_OTLP_PROTOCOL)
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _version() -> str:
    try:
        return importlib.metadata.version("specroute")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a bare checkout
        return "0"


async def tracing_ctx(app: web.Application) -> AsyncIterator[None]:
    """The app's cleanup_ctx: tracing from OTEL_* at start; at the end the spans still
    queued are sent (in a thread: the exporter's requests are blocking)."""
    tracing = app[TRACING] = from_env()
    yield
    if tracing.provider is not None:
        await asyncio.to_thread(tracing.provider.shutdown)


# ---- the request's SERVER span ---------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def trace_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A SERVER span around every request but the probes' and pollers' (`_UNTRACED`),
    current while the handler runs: the pipeline names it and the upstream calls are
    its children. Outermost, so it sees the status an error became."""
    tracing = request.app.get(TRACING)
    if tracing is None or tracing.tracer is None or request.path.startswith(_UNTRACED):
        return await handler(request)
    from opentelemetry import context, propagate
    from opentelemetry.trace import SpanKind

    name, attributes = _server_span(request)
    # The client's context made current (its span the parent, its baggage kept), then ours.
    token = context.attach(propagate.extract(request.headers))
    try:
        with tracing.tracer.start_as_current_span(
            name,
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                _http_status(span, exc.status, server=True)
                raise
            except asyncio.CancelledError:
                span.set_attribute("error.type", "client_disconnect")
                raise
            except Exception as exc:
                _failed(span, type(exc).__qualname__)
                raise
            _http_status(span, response.status, server=True)
            return response
    finally:
        context.detach(token)


def _server_span(request: web.Request) -> tuple[str, dict[str, Any]]:
    """HTTP's conventions: "{method} {route}" (the catch-all's: the method alone) and
    the request's attributes, until a routed request's body names the inference."""
    resource = request.match_info.route.resource
    template = resource.canonical if resource is not None else ""
    attributes: dict[str, Any] = {
        "http.request.method": request.method,
        "url.path": request.path,
        "url.scheme": request.scheme,
    }
    if agent := request.headers.get("User-Agent"):
        attributes["user_agent.original"] = agent
    if not template or "{tail" in template:  # passed through: no route of ours
        return request.method, attributes
    attributes["http.route"] = template
    return f"{request.method} {template}", attributes


def annotate(
    tracing: Tracing | None, record: RequestRecord, report: Mapping[str, Any] | None
) -> None:
    """Name the current (server) span after the inference and put on it what was asked,
    decided and measured. A no-op without a recording span (tracing off, ext-proc)."""
    if not _on(tracing):
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.update_name(span_name(record.endpoint, record.body))
    span.set_attributes(request_attributes(record.endpoint, record.body))
    span.set_attributes(_response_attributes(report))
    decision = record.decision
    ours: dict[str, Any] = {"specroute.status": record.status, "specroute.pair": record.pair}
    if record.route is not None:
        ours["specroute.route"] = record.route.value
    if decision is not None:
        ours["specroute.reason"] = decision.reason
        for route, seconds in (decision.predicted_s or {}).items():
            ours[f"specroute.predicted_s.{route.value}"] = round(seconds, 6)
    if record.failover_from is not None:
        ours["specroute.failover_from"] = record.failover_from.value
    if record.features is not None:
        ours["specroute.workload"] = record.features.workload.value
        ours["gen_ai.request.stream"] = record.features.stream
    if record.prompt_tokens is not None:
        ours["gen_ai.usage.input_tokens"] = record.prompt_tokens
    if record.completion_tokens is not None:
        ours["gen_ai.usage.output_tokens"] = record.completion_tokens
    if record.ttft_s is not None:
        ours["gen_ai.response.time_to_first_chunk"] = round(record.ttft_s, 6)
    span.set_attributes(ours)
    if record.status in ("5xx", "stream_error"):
        _failed(span, record.error or record.status)


def span_name(endpoint: Endpoint, body: Mapping[str, Any]) -> str:
    """ "{gen_ai.operation.name} {gen_ai.request.model}", as the GenAI conventions name it."""
    operation = _OPERATIONS[endpoint]
    model = body.get("model")
    return f"{operation} {model}" if isinstance(model, str) and model else operation


def request_attributes(endpoint: Endpoint, body: Mapping[str, Any]) -> dict[str, Any]:
    """The GenAI conventions' request attributes, from the client's body."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": _OPERATIONS[endpoint],
        "gen_ai.provider.name": PROVIDER,
    }
    if isinstance(model := body.get("model"), str):
        attributes["gen_ai.request.model"] = model
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        if _is_number(limit := body.get(key)):
            attributes["gen_ai.request.max_tokens"] = limit
            break
    for key in ("temperature", "top_p"):
        if _is_number(value := body.get(key)):
            attributes[f"gen_ai.request.{key}"] = value
    return attributes


def _response_attributes(report: Mapping[str, Any] | None) -> dict[str, Any]:
    """gen_ai.response.model and .id from the answer (or its usage chunk)."""
    attributes: dict[str, Any] = {}
    if report is None:
        return attributes
    if isinstance(model := report.get("model"), str):
        attributes["gen_ai.response.model"] = model
    if isinstance(answer_id := report.get("id"), str):
        attributes["gen_ai.response.id"] = answer_id
    return attributes


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _http_status(span: Span, status: int, *, server: bool) -> None:
    """HTTP's conventions: a 5xx is a server span's error, a 4xx too for a client's."""
    span.set_attribute("http.response.status_code", status)
    if status >= 500 or (status >= 400 and not server):
        _failed(span, str(status))


def _failed(span: Span, kind: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", kind)
    span.set_status(Status(StatusCode.ERROR, kind))


# ---- a call to a backend: its CLIENT span ----------------------------------------------


@dataclass(slots=True)
class Call:
    """One call to a backend: the trace headers it sends (its span's context; none of
    its own with tracing off), and what it learned on the way."""

    headers: dict[str, str] = field(default_factory=dict)
    span: Span | None = None
    error: str | None = None

    def answered(self, status: int) -> None:
        if self.span is not None:
            _http_status(self.span, status, server=False)

    def failed(self, kind: str) -> None:
        self.error = kind
        if self.span is not None:
            _failed(self.span, kind)


@contextlib.contextmanager
def routed_call(tracing: Tracing | None, life: RequestLife, route: str, url: str) -> Iterator[Call]:
    """A routed request's call to `route`'s server at `url`: a CLIENT span named as
    the inference, the meter's usage and answer on it at the end. Off, no attribute
    is built (it was a tenth of a millisecond per request, for nothing)."""
    if (spanless := _spanless_call(tracing)) is not None:
        yield spanless
        return
    attributes = {
        **request_attributes(life.endpoint, life.body),
        **_url_attributes("POST", url),
        "specroute.route": route,
    }
    name = span_name(life.endpoint, life.body)
    with _client_call(tracing, name, attributes, life.meter) as call:
        yield call


@contextlib.contextmanager
def passthrough_call(tracing: Tracing | None, method: str, url: str, route: str) -> Iterator[Call]:
    """A passed-through request's call: a CLIENT span named by its method."""
    if (spanless := _spanless_call(tracing)) is not None:
        yield spanless
        return
    attributes = {**_url_attributes(method, url), "specroute.route": route}
    with _client_call(tracing, method, attributes, None) as call:
        yield call


@contextlib.contextmanager
def shadow_call(
    tracing: Tracing | None,
    user: Mapping[str, str],
    *,
    endpoint: Endpoint,
    body: Mapping[str, Any],
    route: str,
    url: str,
    of: str,
) -> Iterator[Call]:
    """A shadow copy's call. Tracing on: a CLIENT span, root of its own trace, linked to
    the user's request (`user`: the trace context it carried), and its baggage. Off:
    the user's trace headers as they came."""
    if not _on(tracing):
        yield Call(dict(forwarded(user)))
        return
    from opentelemetry import propagate, trace

    context = propagate.extract(user)  # the user's span, and its baggage
    users_span = trace.get_current_span(context).get_span_context()
    links = [trace.Link(users_span, {"specroute.link": "shadow_of"})] if users_span.is_valid else []
    root = trace.set_span_in_context(trace.INVALID_SPAN, context)  # baggage, no parent
    attributes = {
        **request_attributes(endpoint, body),
        **_url_attributes("POST", url),
        "specroute.route": route,
        "specroute.shadow": True,
        "specroute.shadow_of": of,
    }
    name = f"shadow {span_name(endpoint, body)}"
    with _client_call(tracing, name, attributes, None, context=root, links=links) as call:
        yield call


def _spanless_call(tracing: Tracing | None) -> Call | None:
    """The call when it makes no span: tracing off, or its trace sampled out."""
    if not _on(tracing):
        return Call()
    if _sampled_out():
        return _unsampled_call()
    return None


def _sampled_out() -> bool:
    """The request's span exists and records nothing: the sampler said no to its trace.
    Its calls then make no span of their own, and build no attributes for one."""
    from opentelemetry import trace

    span = trace.get_current_span()
    return span.get_span_context().is_valid and not span.is_recording()


def _unsampled_call() -> Call:
    """A call in a trace not sampled: the backend continues the request's context, its
    not-sampled flag, trace state and baggage with it (so vLLM samples it out too)."""
    from opentelemetry import propagate

    call = Call()
    propagate.inject(call.headers)
    return call


@contextlib.contextmanager
def _client_call(
    tracing: Tracing | None,
    name: str,
    attributes: Mapping[str, Any],
    meter: Meter | None,
    **start: Any,
) -> Iterator[Call]:
    if tracing is None or tracing.tracer is None:
        yield Call()
        return
    from opentelemetry import propagate, trace

    span = tracing.tracer.start_span(
        name, kind=trace.SpanKind.CLIENT, attributes=attributes, **start
    )
    call = Call(span=span)
    # The context the backend continues: this span's, the trace's state and baggage.
    propagate.inject(call.headers, context=trace.set_span_in_context(span, start.get("context")))
    try:
        yield call
    except asyncio.CancelledError:
        span.set_attribute("error.type", "cancelled")
        raise
    except Exception as exc:
        if call.error is None:  # a failure the caller named is better than its type
            call.failed(getattr(exc, "kind", None) or type(exc).__qualname__)
        raise
    finally:
        if meter is not None:
            _meter_attributes(span, meter)
        span.end()


def _meter_attributes(span: Span, meter: Meter) -> None:
    """What the answer's bytes showed, on the call that brought them."""
    span.set_attributes(_response_attributes(meter.report))
    usage = meter.usage or {}
    for ours, theirs in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens")):
        if isinstance(count := usage.get(theirs), int):
            span.set_attribute(f"gen_ai.usage.{ours}", count)
    if meter.error_kind is not None:
        _failed(span, meter.error_kind)


def _url_attributes(method: str, url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    if parts.username or parts.password:  # HTTP's conventions: never the credentials
        host = parts.hostname or ""
        url = parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host).geturl()
    attributes: dict[str, Any] = {"http.request.method": method, "url.full": url}
    if parts.hostname:
        attributes["server.address"] = parts.hostname
    if parts.port:
        attributes["server.port"] = parts.port
    return attributes
