"""Prometheus metrics (one registry per app) and structlog set-up.

Labels are deliberately few and bounded: route, workload, reason and status
class, and an endpoint's URL (as many as the config lists). A route is labelled
`route` in every metric (`from_route`/`to_route` for a failover). A label per
user, model string or prompt would make every dashboard query slow and every
Prometheus server unhappy. A quantity from 0 to 1 is named `_ratio`.

No counter or histogram exports a `_created` series (the registry leaves them
out; see _Registry), and the registry carries the process, platform and GC
collectors and `specroute_build_info`. `specroute_extproc_streams_total` is
registered by `specroute ext-proc` only (ExtProcMetrics).
"""

from __future__ import annotations

import importlib.metadata
import json as stdlib_json
import logging
import platform
import sys
from collections.abc import Callable, Iterable
from typing import Any

import orjson
import structlog
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric

from classifier.profile import EngineProfile

# Generation latencies run from tens of milliseconds to minutes.
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30)
_TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1)


_SERIES_WITH_CREATED = ("counter", "histogram", "summary", "gaugehistogram")


class _Registry(CollectorRegistry):
    """A registry whose counters and histograms export no `_created` series.

    prometheus_client's own switch (disable_created_metrics(), or the variable
    PROMETHEUS_DISABLE_CREATED_SERIES read at import) is process-wide: it would
    also strip the emulated vLLM's `_created` series (tooling/emulator exports
    them as vLLM does, and gateway/backends/scraper.py reads
    vllm:spec_decode_num_draft_tokens_created to see a restart) wherever both run
    in one process (`serve --emulate`, the tests). This registry leaves them out
    of its own exposition only."""

    def collect(self) -> Iterable[Metric]:
        for metric in super().collect():
            if metric.type not in _SERIES_WITH_CREATED:
                yield metric
                continue
            created = metric.name + "_created"
            kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            kept.samples = [s for s in metric.samples if s.name != created]
            yield kept


class _SeenLabels(MetricWrapperBase):
    """labels() for a label set seen before is one dict look-up: prometheus_client's
    checks the names, converts each value and takes a lock every time (a third of the
    metrics' cost per request, at up to eight series a request). A new label set, or
    values that are not strings, take prometheus_client's way."""

    def labels(self, *labelvalues: object, **labelkwargs: object) -> Any:
        if not labelkwargs:
            seen: Any = labelvalues  # the str tuples it keeps; other values miss
            child = self._metrics.get(seen)
            if child is not None:
                return child
        return super().labels(*labelvalues, **labelkwargs)


class _Counter(_SeenLabels, Counter):
    pass


class _Gauge(_SeenLabels, Gauge):
    pass


class _Histogram(_SeenLabels, Histogram):
    pass


def _version() -> str:
    try:
        return importlib.metadata.version("specroute")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "unknown"


class Metrics:
    """Every metric the gateway exports, bound to its own registry."""

    def __init__(self) -> None:
        self.registry = _Registry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.build_info = _Gauge(
            "specroute_build_info",
            "Always 1: the specroute version and the Python it runs on.",
            ["version", "python"],
            registry=r,
        )
        self.build_info.labels(_version(), platform.python_version()).set(1)
        self.requests = _Counter(
            "specroute_requests",
            "Requests answered, by route, workload and status class.",
            ["route", "workload", "status"],
            registry=r,
        )
        self.decisions = _Counter(
            "specroute_route_decisions",
            "Routing decisions, by route and reason.",
            ["route", "reason"],
            registry=r,
        )
        self.duration = _Histogram(
            "specroute_request_duration_seconds",
            "End-to-end request latency seen by the gateway.",
            ["route", "workload"],
            buckets=_E2E_BUCKETS,
            registry=r,
        )
        self.ttft = _Histogram(
            "specroute_time_to_first_token_seconds",
            "Time to the first generated token; streamed answers only (a whole answer has no "
            "first token the gateway sees).",
            ["route", "workload"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = _Histogram(
            "specroute_time_per_output_token_seconds",
            "Time per output token after the first; streamed answers only (it needs the first "
            "token's time).",
            ["route", "workload"],
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.slo = _Counter(
            "specroute_slo_requests",
            "Answered requests with a latency target (llm-d's SLO headers or the model's "
            "default), per target (ttft, tpot) and outcome: met, missed, or unmeasured (a "
            "whole answer: the gateway sees no first token).",
            ["route", "workload", "target", "outcome"],
            registry=r,
        )
        self.output_tokens = _Counter(
            "specroute_output_tokens",
            "Completion tokens reported by the backends.",
            ["route", "workload"],
            registry=r,
        )
        self.inflight = _Gauge(
            "specroute_inflight_requests",
            "Requests the gateway is forwarding now, by route.",
            ["route"],
            registry=r,
        )
        self.prefill_pending = _Gauge(
            "specroute_prefill_pending_tokens",
            "Prompt tokens of streams forwarded to a route with no first token back yet.",
            ["route"],
            registry=r,
        )
        self.upstream_errors = _Counter(
            "specroute_upstream_errors",
            "Failures talking to a route's servers, by kind.",
            ["route", "kind"],
            registry=r,
        )
        self.failovers = _Counter(
            "specroute_failovers",
            "Requests answered by the other route than the one chosen, by from/to.",
            ["from_route", "to_route"],
            registry=r,
        )
        self.backend_up = _Gauge(
            "specroute_backend_up",
            "1 while any server of the route takes requests (specroute_endpoint_up per URL).",
            ["route"],
            registry=r,
        )
        self.endpoint_up = _Gauge(
            "specroute_endpoint_up",
            "1 while the server at url takes requests: its last /health answered 200 and it "
            "is not ejected; 0 while it is down, refused a connection or is ejected.",
            ["route", "url"],
            registry=r,
        )
        self.endpoint_ejections = _Counter(
            "specroute_endpoint_ejections",
            "Times the server at url was taken out of rotation for failing requests in a row "
            "(upstream.eject_after_failures) for upstream.eject_s.",
            ["route", "url"],
            registry=r,
        )

        self.scrape_errors = _Counter(
            "specroute_scrape_errors",
            "Scrapes of the server at url's /metrics that failed, and figures of a scrape "
            "thrown away (then unknown), by kind: non_finite (NaN, Inf), negative, "
            "out_of_range (running or waiting over 1e6, KV usage over 1), malformed (a line "
            "that does not parse, or bad HTTP), too_large (a body over 16 MiB, dropped "
            "unread), http_status (not 200), unreachable, timeout.",
            ["route", "url", "kind"],
            registry=r,
        )

        self.acceptance = _Histogram(
            "specroute_spec_acceptance_ratio",
            "Per-request accepted drafts per decode step / k on a speculative route, every "
            "step counted (a step yields 1 + k x this), by route, workload and source.",
            ["route", "workload", "source"],
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
            registry=r,
        )
        self.prediction_ratio = _Histogram(
            "specroute_latency_prediction_ratio",
            "Measured / predicted end-to-end latency of the route taken (1 = exact).",
            ["route"],
            buckets=(0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 4),
            registry=r,
        )
        self.gpu_shared = _Gauge(
            "specroute_gpu_shared",
            "Whether the router treats a pair's two servers as sharing one GPU: 1 yes, 0 a GPU "
            'each, NaN while it measures (shared_gpu = "auto") or for a policy without the '
            "notion; by pair (backends.pairs: 0 .. GPUs-1)",
            ["pair"],
            registry=r,
        )
        self.profile_step = _Gauge(
            "specroute_profile_step_seconds",
            "The engine profile's decode step (speculative: draft + verify) by route and "
            "batch size, as measured by `specroute profile` or at start",
            ["route", "batch"],
            registry=r,
        )
        self.profile_ttft = _Gauge(
            "specroute_profile_ttft_seconds",
            "The engine profile's time to first token by route and prompt tokens",
            ["route", "prompt_tokens"],
            registry=r,
        )
        self.profile_beside = _Gauge(
            "specroute_profile_beside_ratio",
            "The engine profile's step of a route while another server of its GPU is busy "
            "over its step alone, by route (about 1: a GPU each; about 2: one time-sliced GPU)",
            ["route"],
            registry=r,
        )
        self.estimated_acceptance = _Gauge(
            "specroute_estimated_acceptance_ratio",
            "The cost model's per-position draft acceptance estimate a, by speculative route "
            "and workload.",
            ["route", "workload"],
            registry=r,
        )
        self.backend_running = _Gauge(
            "specroute_backend_running",
            "Requests the route's servers report running (vllm:num_requests_running); NaN if "
            "unknown.",
            ["route"],
            registry=r,
        )
        self.backend_waiting = _Gauge(
            "specroute_backend_waiting",
            "Requests the route's servers report waiting (vllm:num_requests_waiting); NaN if "
            "unknown.",
            ["route"],
            registry=r,
        )
        self.backend_kv_usage = _Gauge(
            "specroute_backend_kv_cache_usage_ratio",
            "KV-cache usage 0..1 of the route's fullest server (vllm:kv_cache_usage_perc); NaN "
            "if unknown.",
            ["route"],
            registry=r,
        )
        self.backend_acceptance = _Gauge(
            "specroute_backend_spec_acceptance_ratio",
            "Draft-token acceptance over the last scrape window with drafts (vLLM counters).",
            ["route"],
            registry=r,
        )
        self.backend_acceptance_length = _Gauge(
            "specroute_backend_spec_mean_acceptance_length",
            "Tokens per verify step over the last scrape window with drafts (vLLM counters).",
            ["route"],
            registry=r,
        )
        self.attributed_acceptance = _Gauge(
            "specroute_attributed_acceptance_ratio",
            "Accepted/drafted tokens per workload, attributed from vLLM's spec_decode counters "
            "by decoding time, per speculative route; NaN until its standard error is below 0.03.",
            ["route", "workload"],
            registry=r,
        )
        self.attributed_draft_tokens = _Gauge(
            "specroute_attributed_draft_tokens",
            "Effective (decayed, other workloads' share removed) drafted tokens behind each "
            "workload's attributed acceptance, per speculative route.",
            ["route", "workload"],
            registry=r,
        )
        self.attribution_windows = _Counter(
            "specroute_attribution_windows",
            "Scrape windows of the speculative counters, by outcome: attributed, or why not "
            "(reset, stale, foreign, unattributed, lost, no_drafts, invalid).",
            ["route", "outcome"],
            registry=r,
        )
        self.acceptance_source = _Gauge(
            "specroute_acceptance_source",
            "1 for the acceptance source in use for speculative answers: per_request_metrics, "
            "counter_attribution, stream_steps or unknown (no speculative answer yet).",
            ["source"],
            registry=r,
        )
        # Shadow copies (gateway/shadow/runner.py): never in the user metrics above.
        self.shadow_requests = _Counter(
            "specroute_shadow_requests",
            "Shadow copies, by workload and outcome: completed, cancelled (a user request "
            "needed the GPU, a backend left rotation, a drain), skipped (never ran: no idle "
            "time in time, a queue overflow, a backend unhealthy), failed.",
            ["workload", "outcome"],
            registry=r,
        )
        self.shadow_inflight = _Gauge(
            "specroute_shadow_inflight",
            "Shadow copies running now (at most shadow.max_inflight).",
            registry=r,
        )
        self.shadow_seconds = _Counter(
            "specroute_shadow_paired_seconds",
            "Sums of e2e seconds over comparable pairs (a user request that ran alone and its "
            "shadow copy), by workload and side: speculative, baseline, chosen (the user's "
            "route), faster (the faster of the two). baseline/speculative is the live speedup, "
            "chosen/faster the live regret.",
            ["workload", "side"],
            registry=r,
        )
        self.shadow_speedup = _Gauge(
            "specroute_shadow_speedup",
            "Live paired speedup since start: baseline e2e / speculative e2e summed over "
            "comparable pairs; NaN before the first.",
            ["workload"],
            registry=r,
        )
        self.shadow_regret = _Gauge(
            "specroute_shadow_regret",
            "Live regret since start: the chosen route's e2e / the faster of the pair's, "
            "summed over comparable pairs (1 = every choice was the faster); NaN before the "
            "first.",
            ["workload"],
            registry=r,
        )
        # The outcome log's writer (gateway/outcomes/outcome_log.py): never a silent loss.
        self.outcome_log_write_failures = _Counter(
            "specroute_outcome_log_write_failures",
            "Writes, opens and rotations of the outcome log that failed (a full disk, a "
            "removed directory), by log: outcomes, or shadows (its sibling file).",
            ["log"],
            registry=r,
        )
        self.outcome_log_dropped = _Counter(
            "specroute_outcome_log_dropped",
            "Lines of the outcome log never written, by log and reason: queue_full (the "
            "writer fell behind), unserializable (nested past the recursion limit, a "
            "non-finite number), write_failed, shutdown (still queued when close gave up).",
            ["log", "reason"],
            registry=r,
        )

    def show_profile(self, profile: EngineProfile) -> None:
        """Export a profile that came into use (the step and first-token curves)."""
        for route in profile.routes:
            self.profile_beside.labels(route.name).set(route.beside)
            for x, y in zip(route.step.xs, route.step.ys, strict=True):
                self.profile_step.labels(route.name, f"{x:g}").set(y)
            for x, y in zip(route.ttft.xs, route.ttft.ys, strict=True):
                self.profile_ttft.labels(route.name, f"{x:g}").set(y)


class ExtProcMetrics:
    """What only `specroute ext-proc` exports, added to its app's registry."""

    ENDS = ("closed", "cancelled")

    def __init__(self, registry: CollectorRegistry) -> None:
        self.streams = _Counter(
            "specroute_extproc_streams",
            "Envoy's gRPC streams (one per request) that ended, by how: closed (Envoy "
            "half-closed it when the request ended, the client's leaving included), "
            "cancelled (Envoy reset it: a bootstrap without ext_proc_graceful_grpc_close, a "
            "message_timeout, Envoy's remote-close timeout, Envoy gone).",
            ["end"],
            registry=registry,
        )
        for end in self.ENDS:
            self.streams.labels(end)


def configure_logging(level: str = "info", *, json: bool = True) -> None:
    """Configure structlog at start: contextvars merged first, JSON last; call it
    again (a reload) to change the level.

    Loggers are cached on first use and keep the processors and wrapper they were
    built with, so the level cannot live in either: the first processor reads it.
    """
    global _min_level
    _min_level = logging.getLevelNamesMapping()[level.upper()]
    processors: list[structlog.typing.Processor] = [
        _drop_below_level,
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        structlog.processors.JSONRenderer(_dumps) if json else structlog.dev.ConsoleRenderer(),
    ]
    _route_stdlib_logging()
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


_min_level = logging.INFO
_METHOD_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
}


def _dumps(event: dict[str, Any], default: Callable[[Any], Any]) -> str:
    """A log line's JSON by orjson: the request's line was half the log line's CPU in
    json.dumps (docs/benchmarks.md). What orjson refuses (an int past 64 bits) and a
    line with non-ASCII text go through json.dumps as before."""
    try:
        line = orjson.dumps(event, default=default, option=orjson.OPT_NON_STR_KEYS)
        if line.isascii():
            return line.decode()
    except orjson.JSONEncodeError:
        pass
    # json.dumps as before: non-ASCII as \u escapes, so no stderr's encoding can refuse it
    return stdlib_json.dumps(event, default=default)


def _drop_below_level(
    logger: object, method_name: str, event_dict: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    if _METHOD_LEVELS.get(method_name, logging.CRITICAL) < _min_level:
        raise structlog.DropEvent
    return event_dict


class _OneJsonLine(logging.Handler):
    """aiohttp and asyncio log through the standard library, malformed HTTP with a
    12-line traceback holding the client's header bytes: one JSON line instead,
    with the exception's type and status but neither its text nor its traceback."""

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        structlog.get_logger(record.name).log(
            record.levelno,
            record.getMessage().split("\n", 1)[0],
            error=type(exc).__name__ if exc else None,
            http_status=getattr(exc, "code", None),
        )


def _route_stdlib_logging() -> None:
    root = logging.getLogger()
    root.handlers = [_OneJsonLine()]
    root.setLevel(logging.WARNING)
