"""Trace context through the gateway, and its OpenTelemetry spans (gateway/wire/tracing.py).

Every server is real, on 127.0.0.1: the emulated vLLM pair (with a middleware that
records the headers each request came with and, as vLLM does with
--otlp-traces-endpoint, makes its own span from the traceparent it got), the
gateway, and an OTLP/HTTP receiver that decodes what the exporters send with
opentelemetry-proto. The test is the client: its own span is the trace's root.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from multidict import CIMultiDict
from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.state import METRICS
from gateway.wire.tracing import exporters_wanted, trace_id_of
from tests.gateway.conftest import ServerFactory
from tests.support import wait_until
from tooling.emulator import EmulatorConfig, SharedGpu, create_emulator_app
from tooling.local_stack import MODEL, gateway_config

Client = TestClient[web.Request, web.Application]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
TRACESTATE = "vendor=opaque,other=1"
BAGGAGE = "tenant=acme"
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Say hi."}],
    "max_tokens": 8,
    "temperature": 0,
}


# ---- an OTLP/HTTP receiver -------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent: str
    attributes: dict[str, Any]
    links: list[tuple[str, str, dict[str, Any]]]


def _value(any_value: Any) -> Any:
    return getattr(any_value, any_value.WhichOneof("value"))


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


@dataclass
class Receiver:
    """POST /v1/traces as a collector takes it: protobuf in, the spans kept."""

    spans: list[Span] = field(default_factory=list)
    posts: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        return app

    async def _traces(self, request: web.Request) -> web.Response:
        self.posts += 1
        assert request.content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    links = [
                        (lk.trace_id.hex(), lk.span_id.hex(), _attributes(lk.attributes))
                        for lk in s.links
                    ]
                    self.spans.append(
                        Span(
                            service,
                            s.name,
                            s.kind,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            _attributes(s.attributes),
                            links,
                        )
                    )
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    def one(self, service: str, kind: int, name_prefix: str = "") -> Span:
        (span,) = [
            s
            for s in self.spans
            if s.service == service and s.kind == kind and s.name.startswith(name_prefix)
        ]
        return span


SERVER, CLIENT = 2, 3  # OTLP's SpanKind numbers


def continued(headers: CIMultiDict[str]) -> tuple[str, str]:
    """The trace and the parent span the one traceparent names (sampled: checked here)."""
    (traceparent,) = headers.getall("traceparent")
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00" and int(flags, 16) & 1, traceparent
    return trace_id, span_id


def printed(spans: list[Span]) -> str:
    """The trace as the closing report shows it: span, parent, attributes."""
    lines = []
    for s in spans:
        lines.append(f"{s.service:>15} {s.name!r} kind={s.kind} trace={s.trace_id}")
        lines.append(f"{'':>15} span={s.span_id} parent={s.parent or '-'} links={s.links}")
        for key in sorted(s.attributes):
            lines.append(f"{'':>17}{key} = {s.attributes[key]!r}")
    return "\n".join(lines)


@pytest.fixture
async def receiver(aiohttp_server: ServerFactory) -> tuple[Receiver, str]:
    collector = Receiver()
    server = await aiohttp_server(collector.app())
    return collector, str(server.make_url("/v1/traces"))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No OTEL_* of the machine's: each test sets what it means."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    return monkeypatch


# ---- the emulated vLLM pair, as a traced vLLM ------------------------------------------


@dataclass
class Seen:
    """What the emulated servers were sent: (server, method path, headers)."""

    requests: list[tuple[str, str, CIMultiDict[str]]] = field(default_factory=list)

    def of(self, path: str) -> list[tuple[str, CIMultiDict[str]]]:
        return [(server, h) for server, p, h in self.requests if p == path]


def traced_vllm(
    config: EmulatorConfig, gpu: SharedGpu, seen: Seen, provider: TracerProvider | None
) -> web.Application:
    """The emulator, recording what each request came with; with `provider`, it also
    makes vLLM's span (`llm_request`, SERVER) from the traceparent it got."""
    app = create_emulator_app(config, gpu)
    tracer = provider.get_tracer("vllm") if provider else None

    @web.middleware
    async def record(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path in ("/health", "/metrics"):
            return await handler(request)
        seen.requests.append(
            (config.mode, f"{request.method} {request.path}", CIMultiDict(request.headers))
        )
        if tracer is None:
            return await handler(request)
        with tracer.start_as_current_span(
            "llm_request",
            context=propagate.extract(request.headers),
            kind=trace.SpanKind.SERVER,
            attributes={"gen_ai.request.id": request.headers.get("X-Request-Id", "")},
        ):
            return await handler(request)

    app.middlewares.append(record)
    return app


def exporting(url: str, service: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource({"service.name": service}), shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    return provider


Stack = Callable[..., Awaitable[Client]]


@pytest.fixture
def stack(
    aiohttp_server: ServerFactory, aiohttp_client: Any, tokens: TokenCounter
) -> Callable[..., Awaitable[tuple[Client, Seen]]]:
    """The gateway in front of the emulated pair (one emulated GPU), as the env sets it."""

    async def make(
        vllm_provider: TracerProvider | None = None, **sections: Any
    ) -> tuple[Client, Seen]:
        seen, gpu = Seen(), SharedGpu()
        spec_cfg = EmulatorConfig(mode="speculative", model=MODEL, time_scale=0.1)
        base_cfg = EmulatorConfig(mode="baseline", model=MODEL, time_scale=0.1)
        spec = await aiohttp_server(traced_vllm(spec_cfg, gpu, seen, vllm_provider))
        base = await aiohttp_server(traced_vllm(base_cfg, gpu, seen, vllm_provider))
        config = gateway_config(
            str(spec.make_url("")),
            str(base.make_url("")),
            spec_cfg,
            routing={"profile": "off"},  # the profiled policy's prior: predictions, no probes
            **sections,
        )
        client: Client = await aiohttp_client(create_app(config, tokens=tokens))
        return client, seen

    return make


def shadows_completed(client: Client) -> float:
    labels = {"workload": "chat", "outcome": "completed"}
    registry = client.app[METRICS].registry
    return registry.get_sample_value("specroute_shadow_requests_total", labels) or 0.0


# ---- tracing on: one trace, client -> gateway -> emulated vLLM --------------------------


async def test_one_trace_runs_from_the_client_through_the_gateway_to_vllm(
    clean_env: pytest.MonkeyPatch,
    receiver: tuple[Receiver, str],
    stack: Callable[..., Awaitable[tuple[Client, Seen]]],
) -> None:
    collector, url = receiver
    clean_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)
    clean_env.setenv("OTEL_SERVICE_NAME", "specroute")
    client_provider, vllm_provider = exporting(url, "client"), exporting(url, "vllm-emulated")
    gateway, seen = await stack(vllm_provider, shadow={"share": 1.0})

    # The client's own span, and its context on the request, as an instrumented SDK sends it.
    tracer = client_provider.get_tracer("client")
    with tracer.start_as_current_span(f"chat {MODEL}", kind=trace.SpanKind.CLIENT) as root:
        headers: dict[str, str] = {"baggage": BAGGAGE}
        propagate.inject(headers)
        headers = {name.title(): value for name, value in headers.items()}  # any case
        with capture_logs(processors=[merge_contextvars]) as logs:
            response = await gateway.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert response.status == 200, await response.text()
            await response.read()
        passed = await gateway.get("/version", headers=headers)  # passed through
        assert passed.status == 200
        await passed.read()
    trace_id = format(root.get_span_context().trace_id, "032x")
    await wait_until(lambda: shadows_completed(gateway) == 1, "the shadow copy to complete")
    await gateway.close()  # the gateway's cleanup sends what its exporter holds
    for provider in (client_provider, vllm_provider):
        await asyncio.to_thread(provider.shutdown)

    client_span = collector.one("client", CLIENT)
    server = collector.one("specroute", SERVER, "chat ")
    upstream = collector.one("specroute", CLIENT, "chat ")
    print("\n" + printed(collector.spans))

    # client -> gateway's server span -> its client span -> what vLLM got -> vLLM's span
    assert server.trace_id == upstream.trace_id == client_span.trace_id == trace_id
    assert server.parent == client_span.span_id
    assert upstream.parent == server.span_id
    (user_call,) = [
        h for route, h in seen.of("POST /v1/chat/completions") if "-shadow" not in h["X-Request-Id"]
    ]
    assert continued(user_call) == (trace_id, upstream.span_id)
    assert user_call.getall("baggage") == [BAGGAGE]
    vllm = [
        s for s in collector.spans if s.service == "vllm-emulated" and s.parent == upstream.span_id
    ]
    assert len(vllm) == 1 and vllm[0].trace_id == trace_id

    # the GenAI conventions' attributes and specroute's decision
    assert server.name == upstream.name == f"chat {MODEL}"
    attrs = server.attributes
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "vllm"
    assert attrs["gen_ai.request.model"] == attrs["gen_ai.response.model"] == MODEL
    assert attrs["gen_ai.request.max_tokens"] == 8
    assert attrs["gen_ai.request.temperature"] == 0
    assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0
    assert attrs["specroute.route"] in ("speculative", "baseline")
    assert attrs["specroute.reason"]
    assert {"specroute.predicted_s.speculative", "specroute.predicted_s.baseline"} <= set(attrs)
    assert attrs["http.response.status_code"] == 200
    assert upstream.attributes["specroute.route"] == attrs["specroute.route"]
    assert upstream.attributes["gen_ai.usage.output_tokens"] == attrs["gen_ai.usage.output_tokens"]
    assert upstream.attributes["http.response.status_code"] == 200

    # the request's one log line carries the trace id
    (line,) = [e for e in logs if e["event"] == "request"]
    assert line["trace_id"] == trace_id

    # passed through: its own server and client spans in the same trace
    passthrough = collector.one("specroute", CLIENT, "GET")
    assert passthrough.trace_id == trace_id
    (version_call,) = seen.of("GET /version")
    assert continued(version_call[1]) == (trace_id, passthrough.span_id)

    # the shadow copy: a trace of its own, linked to the user's request, marked
    shadow = collector.one("specroute", CLIENT, "shadow ")
    assert shadow.trace_id != trace_id and shadow.parent == ""
    assert shadow.attributes["specroute.shadow"] is True
    assert shadow.links == [(trace_id, server.span_id, {"specroute.link": "shadow_of"})]
    (shadow_call,) = [
        h for route, h in seen.of("POST /v1/chat/completions") if "-shadow" in h["X-Request-Id"]
    ]
    assert continued(shadow_call) == (shadow.trace_id, shadow.span_id)
    assert shadow_call.getall("baggage") == [BAGGAGE]
    assert version_call[1].getall("baggage") == [BAGGAGE]


# ---- tracing off: the headers still go on, nothing is exported --------------------------


@pytest.mark.parametrize(
    "env",
    [
        {},  # nothing asks for traces
        {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "{url}"},
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "{base}"},
    ],
    ids=["unset", "sdk-disabled", "exporter-none"],
)
async def test_off_the_trace_headers_go_on_unchanged_and_nothing_is_exported(
    clean_env: pytest.MonkeyPatch,
    receiver: tuple[Receiver, str],
    stack: Callable[..., Awaitable[tuple[Client, Seen]]],
    env: dict[str, str],
) -> None:
    collector, url = receiver
    for name, value in env.items():
        clean_env.setenv(name, value.format(url=url, base=url.removesuffix("/v1/traces")))
    gateway, seen = await stack(shadow={"share": 1.0})
    sent = {"traceparent": TRACEPARENT, "tracestate": TRACESTATE, "baggage": BAGGAGE}
    with capture_logs(processors=[merge_contextvars]) as logs:
        response = await gateway.post("/v1/chat/completions", json=CHAT, headers=sent)
        assert response.status == 200
        await response.read()
    passed = await gateway.get("/version", headers=sent)
    assert passed.status == 200
    await wait_until(lambda: shadows_completed(gateway) == 1, "the shadow copy to complete")
    await gateway.close()

    calls = seen.of("POST /v1/chat/completions") + seen.of("GET /version")
    assert len(calls) == 3  # routed, its shadow copy, passed through
    for _, headers in calls:
        assert {k: headers.get(k) for k in sent} == sent
    (line,) = [e for e in logs if e["event"] == "request"]
    assert line["trace_id"] == TRACE_ID
    assert collector.posts == 0 and not collector.spans


async def test_without_the_otel_extra_it_forwards_and_says_which_extra(
    clean_env: pytest.MonkeyPatch,
    receiver: tuple[Receiver, str],
    stack: Callable[..., Awaitable[tuple[Client, Seen]]],
) -> None:
    """OTEL_* ask for spans where OpenTelemetry is not installed: one warning, no spans,
    and the headers still go on."""
    collector, url = receiver
    clean_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        clean_env.setitem(sys.modules, name, None)
    with capture_logs(processors=[merge_contextvars]) as logs:
        gateway, seen = await stack()
        response = await gateway.post(
            "/v1/chat/completions", json=CHAT, headers={"traceparent": TRACEPARENT}
        )
        assert response.status == 200
        await response.read()
    await gateway.close()
    (warning,) = [e for e in logs if e["event"] == "tracing_unavailable"]
    assert warning["fix"] == "pip install 'specroute[otel]'"
    ((_, headers),) = seen.of("POST /v1/chat/completions")
    assert headers["traceparent"] == TRACEPARENT
    assert collector.posts == 0


# ---- which variables turn it on ---------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, []),
        ({"OTEL_SERVICE_NAME": "gw", "OTEL_TRACES_SAMPLER": "always_on"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console, otlp"}, ["console", "otlp"]),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, []),
        ({"OTEL_SDK_DISABLED": "TRUE", "OTEL_TRACES_EXPORTER": "otlp"}, []),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, ["otlp"]),
    ],
)
def test_only_the_standard_variables_turn_tracing_on(
    env: dict[str, str], wanted: list[str]
) -> None:
    assert exporters_wanted(env) == wanted


def test_a_trace_id_is_read_only_from_a_well_formed_traceparent() -> None:
    assert trace_id_of({"traceparent": TRACEPARENT}) == TRACE_ID
    assert trace_id_of({"traceparent": f"00-{'0' * 32}-{CLIENT_SPAN}-01"}) is None
    assert trace_id_of({"traceparent": "garbage"}) is None
    assert trace_id_of({}) is None


def span_attributes_built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each time a call's span attributes are built (the URL split, the request's fields)."""
    from gateway.wire import tracing

    built: list[str] = []

    def counted(*args: object) -> dict[str, object]:
        built.append("attributes")
        return {}

    monkeypatch.setattr(tracing, "request_attributes", counted)
    monkeypatch.setattr(tracing, "_url_attributes", counted)
    return built


async def test_off_a_call_builds_no_span_attributes(
    clean_env: pytest.MonkeyPatch,
    stack: Callable[..., Awaitable[tuple[Client, Seen]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tracing off, a routed call costs no span work: its attributes were a tenth of a
    millisecond per request (docs/benchmarks.md), built for nothing."""
    built = span_attributes_built(monkeypatch)
    gateway, _ = await stack()
    response = await gateway.post("/v1/chat/completions", json=CHAT)
    assert response.status == 200, await response.text()
    await response.read()
    assert built == []


async def test_a_trace_sampled_out_costs_no_span_and_tells_the_backend(
    clean_env: pytest.MonkeyPatch,
    receiver: tuple[Receiver, str],
    stack: Callable[..., Awaitable[tuple[Client, Seen]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sampling honoured (issue 53): the client's trace is not sampled, so under the default
    parent-based sampler the gateway records nothing, builds no span attributes for its
    calls, and the backend continues the client's trace with its not-sampled flag."""
    collector, url = receiver
    clean_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)
    built = span_attributes_built(monkeypatch)
    gateway, seen = await stack(shadow={"share": 0.0})
    unsampled = f"00-{TRACE_ID}-{CLIENT_SPAN}-00"
    sent = {"traceparent": unsampled, "tracestate": TRACESTATE, "baggage": BAGGAGE}
    response = await gateway.post("/v1/chat/completions", json=CHAT, headers=sent)
    assert response.status == 200, await response.text()
    await response.read()
    passed = await gateway.get("/version", headers=sent)
    assert passed.status == 200
    await gateway.close()

    calls = seen.of("POST /v1/chat/completions") + seen.of("GET /version")
    assert len(calls) == 2
    for _, headers in calls:
        (traceparent,) = headers.getall("traceparent")
        version, trace_id, _span, flags = traceparent.split("-")
        assert (version, trace_id, flags) == ("00", TRACE_ID, "00"), traceparent
        assert headers.get("tracestate") == TRACESTATE
        assert headers.get("baggage") == BAGGAGE
    assert built == []
    assert not collector.spans
