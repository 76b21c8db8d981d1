"""Which acceptance source feeds the router, and the counter attribution's upkeep.

Why a module of its own: the attribution takes from three places (the
requests' decoding intervals, which BackendPool.track notes; the counter
deltas, which the scraper reads off the request path; the finished answers,
which say whether vLLM sends per-request metrics) and is read from a fourth
(RequestLife.close). This is where they meet, with the metrics and the log
lines that say which source is in use. Nothing here blocks a request: the
attribution runs when a scrape lands, and a request only reads its result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import structlog

from classifier.attribution import CounterAttribution, DecodeLog
from classifier.features import Workload
from classifier.types import Route
from gateway.backends.scraper import Scrape, counter_window
from gateway.telemetry import Metrics
from gateway.wire.acceptance import COUNTER_ATTRIBUTION, PER_REQUEST_METRICS, STREAM_STEPS, UNKNOWN

SOURCES = (PER_REQUEST_METRICS, COUNTER_ATTRIBUTION, STREAM_STEPS, UNKNOWN)

log = structlog.get_logger("specroute.acceptance")


class AcceptanceSources:
    """Counter attribution per speculative route and workload, and which source
    speculative answers use."""

    def __init__(
        self, metrics: Metrics, *, max_window_s: float, speculative: Mapping[Route, int]
    ) -> None:
        """`speculative`: each speculative route's k (a route's counters are its own:
        one route's acceptance is never another's)."""
        self._metrics = metrics
        self._max_window_s = max_window_s
        # A step accepts 0..k of its k drafts: noise alone gives at most k/4 of
        # variance per drafted token, what a rate's standard error starts from.
        self.attribution = {
            route: CounterAttribution([w.value for w in Workload], noise_floor=max(k, 1) / 4)
            for route, k in speculative.items()
        }
        # Whether the speculative server sends per-request metrics: None until
        # a successful speculative answer says so, then what the last one said.
        self.per_request_metrics: bool | None = None
        self._in_use = UNKNOWN
        for source in SOURCES:
            metrics.acceptance_source.labels(source).set(int(source == UNKNOWN))
        for route in self.attribution:
            for w in Workload:
                metrics.attributed_acceptance.labels(route.value, w.value).set(math.nan)
                metrics.attributed_draft_tokens.labels(route.value, w.value).set(0.0)

    @property
    def attribution_ready(self) -> bool:
        """Some speculative route's attribution is certain enough to be used."""
        return any(a.ready for a in self.attribution.values())

    @property
    def in_use(self) -> str:
        """The source speculative answers' acceptance comes from now."""
        return self._in_use

    def announce(self) -> None:
        """The log line at start: nothing is known until a speculative answer."""
        log.info(
            "acceptance_source",
            source=self._in_use,
            per_request_metrics=self.per_request_metrics,
            attribution_ready=self.attribution_ready,
        )

    def attributed_rate(self, route: Route, workload: Workload) -> float | None:
        attribution = self.attribution.get(route)
        estimate = attribution.estimate(workload.value) if attribution is not None else None
        return estimate.rate if estimate else None

    def saw_answer(self, spec_metrics: bool | None) -> None:
        """A finished answer: a successful speculative one says whether vLLM sends
        per-request metrics (spec_metrics); any other (None) says nothing."""
        if spec_metrics is None or spec_metrics == self.per_request_metrics:
            return
        self.per_request_metrics = spec_metrics
        self._update()

    def window(
        self, backend: Route, before: Scrape | None, after: Scrape, decode: DecodeLog, inflight: int
    ) -> str | None:
        """Attribute one server's counter deltas between two scrapes to the requests
        that were decoding there; returns the window's outcome (None: no counters)."""
        if before is None:
            decode.take(after.at, after.at)  # forget what ended before the first scrape
            return None
        decode_s = decode.take(before.at, after.at)
        window = counter_window(before, after)
        attribution = self.attribution.get(backend)
        if window == "no_counters" or attribution is None:
            return None
        if isinstance(window, str):
            outcome = window
        elif window.end - window.start > self._max_window_s:
            outcome = "stale"  # a failed scrape in between: too long to share by time
        elif after.running is not None and after.running > inflight:
            outcome = "foreign"  # the server runs requests the gateway did not send
        elif decode_s is None:
            outcome = "lost"  # more requests ended than the log keeps between scrapes
        elif not any(decode_s.values()):
            outcome = "unattributed"  # drafts, but nothing of ours was decoding
        elif attribution.observe(window.draft_tokens, window.accepted_tokens, decode_s):
            outcome = "attributed"
        else:
            outcome = "invalid"
        self._metrics.attribution_windows.labels(backend.value, outcome).inc()
        if outcome == "attributed":
            self._export(backend, attribution)
            self._update()
        return outcome

    def _export(self, route: Route, attribution: CounterAttribution) -> None:
        m = self._metrics
        for key, estimate in attribution.estimates().items():
            rate = estimate.rate if estimate else math.nan
            m.attributed_acceptance.labels(route.value, key).set(rate)
            m.attributed_draft_tokens.labels(route.value, key).set(attribution.support(key))

    def _update(self) -> None:
        if self.per_request_metrics is None:
            source = UNKNOWN
        elif self.per_request_metrics:
            source = PER_REQUEST_METRICS
        else:
            source = COUNTER_ATTRIBUTION if self.attribution_ready else STREAM_STEPS
        if source == self._in_use:
            return
        m = self._metrics
        m.acceptance_source.labels(self._in_use).set(0)
        m.acceptance_source.labels(source).set(1)
        self._in_use = source
        log.info(
            "acceptance_source",
            source=source,
            per_request_metrics=self.per_request_metrics,
            attribution_ready=self.attribution_ready,
        )
