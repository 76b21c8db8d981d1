"""One request's life: written as it happens, read once when it ends.

Each stage writes its own part: the handler what it parsed and decided
(`RequestLife.decided`), dispatch where the request went (`sent_to`), the
proxy what the answer's bytes showed (`Meter`). When the handler finishes, for
any reason, `RequestLife.close` freezes all of it into a `RequestRecord`, the
one thing that metrics, the canonical log line, learning and the outcome log
read. Nothing reads a half-written life.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from classifier.features import Endpoint, RequestFeatures, Workload
from classifier.types import Decision, LiveState, Route
from gateway.wire.acceptance import MeasuredAcceptance, measured_acceptance, reports_spec_metrics

CLIENT_DISCONNECT = "client_disconnect"
# The client stopped reading: no write made progress for server.send_timeout_s, so the
# gateway hung up (gateway/wire/limits.py). Counted as a disconnect, logged as itself.
CLIENT_SEND_TIMEOUT = "client_send_timeout"
# Envoy ended the picker's stream before the answer ended (gateway/extproc): the
# client went away or the backend broke the answer, and Envoy does not say which.
STREAM_RESET = "stream_reset"
UPSTREAM_ERROR_EVENT = "upstream_error_event"  # a stream the backend ended with an error event
# How a backend fails an answer whose status was sent (specroute_upstream_errors_total's
# kinds: gateway/wire/failures.py's upstream_failure names all but the error event): each
# counts against the backend, and a stream that ends with one is a stream_error.
ANSWER_FAILURES = (
    "upstream_broken",  # the connection or the body cut short
    "upstream_stall",  # silence, or an event (a whole answer) not done in read_timeout_s
    "upstream_malformed",  # what no parser takes: not HTTP, a header or an event too long
    "upstream_truncated",  # a stream ended cleanly without its end ([DONE])
    UPSTREAM_ERROR_EVENT,
)
_STREAM_FAILURES = (*ANSWER_FAILURES, "drained")

# A workload's acceptance rate attributed from vLLM's counters, or None while
# it is too uncertain (AcceptanceSources.attributed_rate).
AttributedRate = Callable[[Route, Workload], float | None]


@dataclass(slots=True)
class Meter:
    """What the answer's bytes showed; written only by the proxy as they pass."""

    started: float
    status: int = 0
    ttft_s: float | None = None
    finished: float | None = None
    usage: dict[str, Any] | None = None
    # The final usage chunk (stream) or whole body (non-stream): vLLM puts
    # its per-request measurements next to the usage.
    report: dict[str, Any] | None = None
    error_kind: str | None = None
    bytes_sent: int = 0
    # SSE events: all of them, those before the first token (role chunk) and
    # the closing ones ([DONE], the usage-only chunk). The rest is one event
    # per engine step that produced tokens.
    events: int = 0
    events_before_token: int = 0
    closing_events: int = 0
    ended: bool = False  # the stream's own end came: [DONE], or a Responses stream's last event
    # Called once at the first token: the backend's prefill of it is done.
    on_first_token: Callable[[], None] | None = None

    def fail(self, kind: str, status: int | None = None) -> None:
        self.error_kind = kind
        if status is not None:
            self.status = status

    def first_token(self) -> None:
        self.ttft_s = time.perf_counter() - self.started
        if self.on_first_token is not None:
            self.on_first_token()

    def finish(self) -> None:
        if self.finished is None:
            self.finished = time.perf_counter()

    @property
    def token_events(self) -> int:
        return self.events - self.events_before_token - self.closing_events


@dataclass(slots=True)
class RequestLife:
    """The mutable half: each stage fills in its own part through one method."""

    request_id: str
    endpoint: Endpoint
    meter: Meter
    features: RequestFeatures | None = None
    decision: Decision | None = None
    state: LiveState | None = None
    route: Route | None = None  # who answered, after any failover
    failover_from: Route | None = None
    batch: int = 0  # requests in flight on that backend (in its pair) when sent, this one incl.
    body: dict[str, Any] = field(default_factory=dict)
    pair: int = 0  # the GPU pair it was decided for (`state` is that pair's)
    # The W3C trace headers it carries on to its shadow copy (gateway/wire/tracing.py).
    trace: dict[str, str] = field(default_factory=dict)

    @classmethod
    def start(
        cls, request_id: str, endpoint: Endpoint, trace: dict[str, str] | None = None
    ) -> RequestLife:
        return cls(request_id, endpoint, Meter(started=time.perf_counter()), trace=trace or {})

    def decided(
        self,
        body: dict[str, Any],
        features: RequestFeatures,
        decision: Decision,
        state: LiveState,
        pair: int = 0,
    ) -> None:
        self.body, self.features, self.decision, self.state = body, features, decision, state
        self.pair = pair

    def sent_to(self, route: Route, batch: int) -> None:
        self.route, self.batch = route, batch

    def failed_over(self, away_from: Route) -> None:
        self.failover_from = away_from

    def close(
        self, ks: Mapping[Route, int], attributed: AttributedRate | None = None
    ) -> RequestRecord:
        """Its record; `ks`: each route's k (a speculative route's answer is measured)."""
        self.meter.finish()
        meter = self.meter
        usage = meter.usage or {}
        completion = usage.get("completion_tokens")
        prompt = usage.get("prompt_tokens")
        status = _status_label(meter)
        route = self.route or (self.decision.route if self.decision else None)
        acceptance = spec_metrics = None
        k = ks.get(route, 0) if route is not None else 0
        if status == "2xx" and route is not None and k > 0:
            spec_metrics = reports_spec_metrics(meter.report)
            acceptance = _acceptance(meter, self.features, completion, route, k, attributed)
        return RequestRecord(
            request_id=self.request_id,
            endpoint=self.endpoint,
            features=self.features,
            decision=self.decision,
            state=self.state,
            route=route,
            failover_from=self.failover_from,
            batch=self.batch,
            status=status,
            http_status=meter.status,
            error=meter.error_kind,
            ttft_s=meter.ttft_s,
            duration_s=(meter.finished or time.perf_counter()) - meter.started,
            prompt_tokens=prompt if isinstance(prompt, int) else None,
            completion_tokens=completion if isinstance(completion, int) else None,
            token_events=meter.token_events,
            acceptance=acceptance,
            body=self.body,
            spec_metrics=spec_metrics,
            pair=self.pair,
            trace=self.trace,
        )


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """Everything one request did, frozen when it ended."""

    request_id: str
    endpoint: Endpoint
    features: RequestFeatures | None  # None: rejected before features were known
    decision: Decision | None
    state: LiveState | None  # the snapshot the decision was made from
    route: Route | None  # who answered (or was meant to)
    failover_from: Route | None
    batch: int
    status: str  # 2xx, 4xx, 5xx, client_disconnect, stream_error, stream_reset (ext-proc)
    http_status: int
    error: str | None
    ttft_s: float | None
    duration_s: float
    prompt_tokens: int | None  # the backend's usage
    completion_tokens: int | None
    token_events: int
    acceptance: MeasuredAcceptance | None
    body: dict[str, Any]
    # A successful speculative answer: did it carry vLLM's per-request metrics?
    # None for every other answer (no evidence either way).
    spec_metrics: bool | None = None
    pair: int = 0  # the GPU pair it was decided for
    trace: dict[str, str] = field(default_factory=dict)  # the trace context it carried on

    @property
    def predicted_s(self) -> float | None:
        """The prediction for the route that answered, if the policy made one."""
        if self.decision is None or not self.decision.predicted_s or self.route is None:
            return None
        return self.decision.predicted_s.get(self.route)

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.completion_tokens is None or self.completion_tokens < 2:
            return None
        return (self.duration_s - self.ttft_s) / (self.completion_tokens - 1)

    @property
    def slo(self) -> dict[str, str] | None:
        """Per latency target the request had (features.targets): "met", "missed", or
        "unmeasured" (a whole answer shows no first token; one token has no TPOT). None:
        no target, or no answer (not 2xx)."""
        features = self.features
        if features is None or features.targets is None or self.status != "2xx":
            return None
        targets, out = features.targets, {}
        for name, target, measured in (
            ("ttft", targets.ttft_s, self.ttft_s),
            ("tpot", targets.tpot_s, self.tpot_s),
        ):
            if target is not None:
                out[name] = (
                    "unmeasured" if measured is None else "met" if measured <= target else "missed"
                )
        return out

    @property
    def lesson(self) -> Lesson | None:
        """What a learning policy may take from this request: only a complete answer."""
        if self.features is None or self.state is None or self.route is None:
            return None
        if self.status != "2xx" or self.error is not None or self.http_status != 200:
            return None
        if self.completion_tokens is None or self.completion_tokens <= 0:
            return None
        rate = self.acceptance.per_step if self.acceptance else None
        return Lesson(
            self.route, self.features, self.state, self.ttft_s, self.duration_s,
            self.prompt_tokens, self.completion_tokens, rate, self.predicted_s, self.pair,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Lesson:
    """A finished, successful request as a policy learns from it (classifier's
    FinishedRequest protocol)."""

    route: Route
    features: RequestFeatures
    state: LiveState
    ttft_s: float | None
    duration_s: float
    prompt_tokens: int | None
    completion_tokens: int
    acceptance: float | None  # accepted drafts per decode step / k (MeasuredAcceptance.per_step)
    predicted_s: float | None
    pair: int = 0  # the GPU pair it was decided for: whose consolidation and topology learn


def _status_label(meter: Meter) -> str:
    if meter.error_kind in (CLIENT_DISCONNECT, STREAM_RESET):
        return meter.error_kind
    if meter.error_kind == CLIENT_SEND_TIMEOUT:
        return CLIENT_DISCONNECT
    if meter.error_kind in _STREAM_FAILURES and meter.status == 200:
        return "stream_error"
    if meter.status == 0:
        return "5xx"  # died before any status: counted as ours
    return f"{meter.status // 100}xx"


def _acceptance(
    meter: Meter,
    features: RequestFeatures | None,
    completion_tokens: object,
    route: Route,
    num_speculative_tokens: int,
    attributed: AttributedRate | None,
) -> MeasuredAcceptance | None:
    """This answer's acceptance from the best source it has (gateway/wire/acceptance.py)."""
    tokens = completion_tokens if isinstance(completion_tokens, int) else None
    if features is None:
        return None
    return measured_acceptance(
        meter.report,
        tokens,
        meter.token_events,
        features.stream and features.n == 1,
        attributed(route, features.workload) if attributed is not None else None,
        num_speculative_tokens,
    )
