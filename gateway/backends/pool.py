"""The backends, one per configured route: endpoints, health, in-flight counts.

The router needs a cheap, always-current picture of load; the gateway's own
in-flight count per backend is that picture (it is exact and costs nothing),
and health probes say which endpoints may be used at all.

A backend (a route) may have several endpoints; `backends.pairs` says which
endpoints of the routes share a GPU. Each such group (`Pair`: a pair for two
routes) is what one decision is about: the request goes to the least loaded
group, the policy sees that group's endpoints only, and the request goes to the
group's endpoint of the route it chose (another endpoint of that route only if
the group's is down). With the default, every endpoint of every route is one group.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import structlog

from classifier.attribution import DecodeLog
from classifier.features import RequestFeatures, Workload
from classifier.types import BackendState, LiveState, Route
from gateway.backends.acceptance_sources import AcceptanceSources
from gateway.backends.models import model_cards, note_models
from gateway.backends.scraper import (
    SCRAPE_ERRORS,
    Acceptance,
    Scrape,
    acceptance_between,
    fresh,
    scrape_once,
    sleep_until_next,
    supervised,
)
from gateway.config import BackendConfig, Pairing, RouteConfig
from gateway.telemetry import Metrics

log = structlog.get_logger("specroute.backends")


@dataclass(slots=True)
class Upstream:
    """One vLLM server: a base URL (without /v1) and what we know of it."""

    url: str
    pair: int = 0  # the GPU group it belongs to (backends.pairs)
    inflight: int = 0
    prefill_tokens: int = 0  # prompts of streams sent here with no first token yet
    mix: dict[Workload, int] = field(default_factory=dict)  # in flight, by workload
    last_start: int = 0  # the pool's sequence number of the newest request sent here
    capacity: float | None = None  # its share of its route's admission limit
    healthy: bool = True  # may take new requests: probe OK and not ejected
    # Its process answers: the last /health probe said 200 and no connection
    # was refused since. An ejected endpoint can be reachable: it is the
    # fallback of last resort, never a reason to answer 502.
    reachable: bool = True
    scrape: Scrape | None = None
    inflight_at_scrape: int = 0  # our in-flight count when that scrape came in
    # Others' requests there at the scrape before the last (None: unknown): requests
    # that are still there a scrape later are not the gateway's own, lagging.
    others_before: int | None = None
    acceptance: Acceptance | None = None  # over the last scrape window with drafts
    consecutive_failures: int = 0
    ejected_until: float = 0.0  # monotonic time; passive ejection keeps it out till then
    # When the requests sent here were decoding, for the counter attribution.
    decode_log: DecodeLog = field(default_factory=DecodeLog)
    # Its /v1/models cards by id, as the last good read (with a health probe) found them;
    # None: never read, unknown (gateway/backends/models.py).
    models: dict[str, dict[str, Any]] | None = None
    models_warned: set[str] = field(default_factory=set)  # requested here, lacked, logged


@dataclass(slots=True)
class Backend:
    route: Route
    upstreams: list[Upstream]
    headers: dict[str, str] = field(default_factory=dict)
    max_inflight: int = 256  # admission limit: beyond it, failover or 429

    @classmethod
    def from_config(
        cls, route: Route, config: BackendConfig, pairing: Pairing = Pairing.ONE
    ) -> Backend:
        headers: dict[str, str] = {}
        if config.api_key_env and (key := os.environ.get(config.api_key_env)):
            headers["Authorization"] = f"Bearer {key}"
        by_index = pairing is Pairing.BY_INDEX
        share = config.max_inflight / len(config.urls)
        upstreams = [
            Upstream(url, i if by_index else 0, capacity=share) for i, url in enumerate(config.urls)
        ]
        return cls(route, upstreams, headers, config.max_inflight)

    @property
    def has_room(self) -> bool:
        return self.inflight < self.max_inflight

    @property
    def inflight(self) -> int:
        return sum(u.inflight for u in self.upstreams)

    def prefill_tokens(self) -> int:
        """Prompt tokens of streams sent here that have no first token yet."""
        return sum(u.prefill_tokens for u in self.upstreams)

    @property
    def healthy(self) -> bool:
        return any(u.healthy for u in self.upstreams)

    @property
    def reachable(self) -> bool:
        return any(u.reachable for u in self.upstreams)

    def proven(self, within: Sequence[Upstream] = ()) -> bool:
        """Healthy, and the endpoint a request would get (pick(within)) has not failed
        since its last success: safe to fail over to without a retry budget."""
        upstream = self.pick(within)
        return upstream.healthy and upstream.consecutive_failures == 0

    def pick(self, within: Sequence[Upstream] = ()) -> Upstream:
        """The least busy healthy endpoint of `within` (a pair's endpoints of this
        route), else of the whole route; else a reachable one, else any."""
        candidates = (
            [u for u in within if u.healthy]
            or [u for u in self.upstreams if u.healthy]
            or [u for u in self.upstreams if u.reachable]
            or self.upstreams
        )
        return min(candidates, key=lambda u: u.inflight)

    def state(self, max_age_s: float = float("inf")) -> BackendState:
        """Live state of all its endpoints; scraped figures older than max_age_s are unknown."""
        return endpoints_state(self.upstreams, max_age_s)


@dataclass(frozen=True, slots=True)
class Pair:
    """The endpoints of every route that share one GPU: what one decision is about
    (backends.pairs; with the default, every endpoint of every route). A pair for
    the two-route configuration; a group of N for N routes."""

    index: int
    endpoints: Mapping[Route, tuple[Upstream, ...]]

    def of(self, route: Route) -> tuple[Upstream, ...]:
        return self.endpoints[route]

    @property
    def upstreams(self) -> tuple[Upstream, ...]:
        """Its endpoints, every route's."""
        return tuple(u for group in self.endpoints.values() for u in group)

    @property
    def inflight(self) -> int:
        """The gateway's requests in flight on its endpoints, every route."""
        return sum(u.inflight for u in self.upstreams)

    @property
    def healthy(self) -> bool:
        return any(u.healthy for u in self.upstreams)

    def state(self, max_age_s: float = float("inf")) -> LiveState:
        """Live state of its endpoints only, for the policy's decision within the group."""
        return LiveState(
            {route: endpoints_state(ups, max_age_s) for route, ups in self.endpoints.items()}
        )


def url_label(url: str) -> str:
    """A server's URL as its metric label and log field: without credentials, if any."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit(parts._replace(netloc=netloc))


def endpoints_state(upstreams: Sequence[Upstream], max_age_s: float) -> BackendState:
    """The router's view of some endpoints of one route, as if they were one server;
    scraped figures older than max_age_s are unknown."""
    scrapes = fresh((u.scrape for u in upstreams), max_age_s)
    others = [_others(u) for u in upstreams if any(u.scrape is s for s in scrapes)]
    known = [n for n in others if n is not None]
    running = [s.running for s in scrapes if s.running is not None]
    waiting = [s.waiting for s in scrapes if s.waiting is not None]
    kv = [s.kv_usage for s in scrapes if s.kv_usage is not None]
    caps = [u.capacity for u in upstreams]
    return BackendState(
        inflight=sum(u.inflight for u in upstreams),
        prefill_tokens=sum(u.prefill_tokens for u in upstreams),
        mix=_mix(upstreams),
        last_start=max((u.last_start for u in upstreams), default=0),
        healthy=any(u.healthy for u in upstreams),
        running=int(sum(running)) if running else None,
        waiting=int(sum(waiting)) if waiting else None,
        kv_cache_usage=max(kv) if kv else None,
        others=sum(known) if known else None,
        capacity=None if None in caps else sum(c for c in caps if c is not None),
    )


def _mix(upstreams: Sequence[Upstream]) -> tuple[tuple[Workload, int], ...]:
    counts: dict[Workload, int] = {}
    for u in upstreams:
        for w, n in u.mix.items():
            if n > 0:
                counts[w] = counts.get(w, 0) + n
    return tuple(sorted(counts.items()))


def _pairs(backends: Iterable[Backend]) -> tuple[Pair, ...]:
    """The groups, from the group index each endpoint was given."""
    by_route = {b.route: b.upstreams for b in backends}
    count = 1 + max(u.pair for upstreams in by_route.values() for u in upstreams)
    pairs = tuple(
        Pair(i, {r: tuple(u for u in ups if u.pair == i) for r, ups in by_route.items()})
        for i in range(count)
    )
    if not all(all(p.endpoints.values()) for p in pairs):
        raise ValueError("backends: every GPU group needs an endpoint of every route")
    return pairs


def _others(upstream: Upstream) -> int | None:
    """Requests at the server that the gateway did not send, as of its last scrape."""
    scrape = upstream.scrape
    if scrape is None or scrape.running is None:
        return None
    return max(0, round(scrape.running + (scrape.waiting or 0)) - upstream.inflight_at_scrape)


class BackendPool:
    def __init__(
        self,
        routes: Mapping[Route, RouteConfig],
        pairing: Pairing,
        metrics: Metrics,
        *,
        scrape_max_age_s: float = 10.0,
        eject_after_failures: int = 3,
        eject_s: float = 10.0,
    ) -> None:
        self._metrics = metrics
        self._scrape_max_age_s = scrape_max_age_s
        self._eject_after = eject_after_failures
        self._eject_s = eject_s
        self._retries_inflight = 0
        self._starts = itertools.count(1)  # requests sent, numbered across every endpoint
        self.probed = False  # the health prober has finished one round
        self._idle = asyncio.Event()  # nothing in flight anywhere: what a drain waits for
        self._idle.set()
        self._backends = {
            route: Backend.from_config(route, config, pairing) for route, config in routes.items()
        }
        self.pairs = _pairs(self._backends.values())
        self.sources = AcceptanceSources(
            metrics,
            max_window_s=scrape_max_age_s,
            speculative={r: c.num_speculative_tokens for r, c in routes.items() if c.speculative},
        )
        for route, backend in self._backends.items():
            metrics.prefill_pending.labels(route.value).set_function(backend.prefill_tokens)
            metrics.inflight.labels(route.value).set(0)
            metrics.backend_up.labels(route.value).set(1)
            for upstream in backend.upstreams:
                metrics.endpoint_up.labels(route.value, url_label(upstream.url)).set(1)
                metrics.endpoint_ejections.labels(route.value, url_label(upstream.url))
                for kind in SCRAPE_ERRORS:
                    metrics.scrape_errors.labels(route.value, url_label(upstream.url), kind)
        for (
            pair
        ) in self.pairs:  # set by learning (gateway/outcomes/learning.py); NaN: not known yet
            metrics.gpu_shared.labels(str(pair.index)).set(float("nan"))

    def of(self, route: Route) -> Backend:
        return self._backends[route]

    def __iter__(self) -> Iterator[Backend]:
        return iter(self._backends.values())

    def choose_pair(self) -> int:
        """The pair a new request goes to: the least loaded (the gateway's requests in
        flight on both its endpoints; ties to the lower index) of those with a healthy
        endpoint (of all of them, when none has one)."""
        usable = [p for p in self.pairs if p.healthy] or self.pairs
        return min(usable, key=lambda p: (p.inflight, p.index)).index

    def live_state(self, pair: int | None = None) -> LiveState:
        """What a decision in `pair` sees: its endpoints only. None: every endpoint of
        each route together (the live figures of /stats)."""
        age = self._scrape_max_age_s
        if pair is not None:
            return self.pairs[pair].state(age)
        return LiveState({route: b.state(age) for route, b in self._backends.items()})

    def others_before(self, pair: int) -> dict[Route, int]:
        """Others' requests on each route of `pair` at the scrape before the last."""
        return {
            route: sum(u.others_before or 0 for u in ups)
            for route, ups in self.pairs[pair].endpoints.items()
        }

    def pick(self, route: Route, pair: int) -> Upstream:
        """The endpoint of `route` a request decided in `pair` goes to: the pair's own,
        else (it is down) the least busy healthy one of the route."""
        return self._backends[route].pick(self.pairs[pair].of(route))

    def batch(self, route: Route, upstream: Upstream) -> int:
        """Requests in flight on `route` in the pair of `upstream`: the batch it joined."""
        return sum(u.inflight for u in self.pairs[upstream.pair].of(route))

    @contextlib.contextmanager
    def track(
        self,
        backend: Backend,
        upstream: Upstream,
        prefill_tokens: int = 0,
        features: RequestFeatures | None = None,
    ) -> Iterator[Callable[[], None]]:
        """Count a request as in flight for exactly as long as the block runs, and its
        prompt as pending prefill until the callable it yields is called (its first
        token) or the block ends, whichever is first.

        With its features, its decoding time is also noted for the counter
        attribution: from the first token (a stream), or from now (a whole
        answer, whose first token the gateway never sees).
        """
        upstream.inflight += 1
        upstream.last_start = next(self._starts)
        self._idle.clear()
        upstream.prefill_tokens += prefill_tokens
        gauge = self._metrics.inflight.labels(backend.route.value)
        gauge.inc()
        pending = prefill_tokens
        decode = upstream.decode_log
        handle = None
        if features is not None:
            since = None if features.stream else time.monotonic()
            handle = decode.begin(features.workload.value, features.n, since)
            upstream.mix[features.workload] = upstream.mix.get(features.workload, 0) + 1

        def release() -> None:
            nonlocal pending
            upstream.prefill_tokens -= pending
            pending = 0

        def first_token() -> None:
            release()
            if handle is not None:
                decode.decoding(handle, time.monotonic())

        try:
            yield first_token
        finally:
            release()
            if handle is not None:
                decode.end(handle, time.monotonic())
            if features is not None:
                upstream.mix[features.workload] -= 1
            upstream.inflight -= 1
            gauge.dec()
            if self.inflight == 0:
                self._idle.set()

    @property
    def inflight(self) -> int:
        return sum(b.inflight for b in self)

    async def wait_idle(self, timeout_s: float) -> int:
        """Wait until nothing is in flight, at most timeout_s; return what still is."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(timeout_s, 0.0)):
                await self._idle.wait()
        return self.inflight

    def report_failure(self, backend: Backend, upstream: Upstream, kind: str) -> None:
        """Count a failure; eject the endpoint after too many in a row (never the last one)."""
        self._metrics.upstream_errors.labels(backend.route.value, kind).inc()
        upstream.consecutive_failures += 1
        if (
            upstream.healthy
            and upstream.consecutive_failures >= self._eject_after
            and self._healthy_count() > 1
        ):
            upstream.healthy = False
            upstream.ejected_until = time.monotonic() + self._eject_s
            url = url_label(upstream.url)
            self._metrics.endpoint_ejections.labels(backend.route.value, url).inc()
            self._export_up()
            log.warning(
                "backend_ejected",
                route=backend.route.value,
                url=url,
                failures=upstream.consecutive_failures,
                eject_s=self._eject_s,
            )

    def report_success(self, upstream: Upstream) -> None:
        upstream.consecutive_failures = 0

    def report_refused(self, backend: Backend, upstream: Upstream, kind: str) -> None:
        """A refused connection: the process is down, so it leaves rotation now, not at
        the next probe, and comes back with the first /health 200 (no ejection time:
        it is down, not misbehaving). If nothing healthy is left, ejected endpoints
        that still answer /health come back at once (an ejection is a guess, a
        refusal a fact)."""
        self._metrics.upstream_errors.labels(backend.route.value, kind).inc()
        if upstream.healthy:
            log.warning("backend_refused", route=backend.route.value, url=url_label(upstream.url))
        upstream.healthy = upstream.reachable = False
        if self._healthy_count() == 0:
            for other in self:
                for u in other.upstreams:
                    if u.reachable and not u.healthy:
                        u.healthy, u.ejected_until, u.consecutive_failures = True, 0.0, 0
                        log.warning(
                            "backend_readmitted", route=other.route.value, url=url_label(u.url)
                        )
        self._export_up()

    def _export_up(self) -> None:
        m = self._metrics
        for backend in self:
            route = backend.route.value
            m.backend_up.labels(route).set(int(backend.healthy))
            for u in backend.upstreams:
                m.endpoint_up.labels(route, url_label(u.url)).set(int(u.healthy))

    def _healthy_count(self) -> int:
        return sum(u.healthy for b in self for u in b.upstreams)

    def try_acquire_retry(self, ratio: float, minimum: int) -> bool:
        """A retry may start while retries in flight stay within the budget.

        The budget (a share of all in-flight requests, at least `minimum`)
        keeps a dead cluster from doubling the load on what is left.
        Pair every True with release_retry().
        """
        total = self.inflight
        if self._retries_inflight >= max(minimum, ratio * total):
            return False
        self._retries_inflight += 1
        return True

    def release_retry(self) -> None:
        self._retries_inflight -= 1

    async def probe_all(self, session: aiohttp.ClientSession, timeout_s: float) -> bool:
        """Probe every endpoint's /health now, and read the models of those that answer
        (gateway/backends/models.py); True if any backend is healthy."""
        pairs = [(b, u) for b in self for u in b.upstreams]
        results = await asyncio.gather(*(_contained(session, b, u, timeout_s) for b, u in pairs))
        now = time.monotonic()
        for (backend, upstream), ok in zip(pairs, results, strict=True):
            if ok is None:
                continue  # its probe raised: no news of it, and the others' answers count
            upstream.reachable = ok
            if ok and upstream.ejected_until > now and self._healthy_count() > 0:
                ok = False  # still serving its ejection, and someone else can answer
            # A 200 says the process answers, not that it generates: a wedged engine's
            # /health says 200 too. So a probe leaves the request failures as they are,
            # and an endpoint readmitted after its ejection is on probation: its next
            # failure ejects it again, its next success clears them (report_success).
            if ok != upstream.healthy:
                log.info(
                    "backend_health_changed",
                    route=backend.route.value,
                    url=url_label(upstream.url),
                    healthy=ok,
                )
            upstream.healthy = ok
        self._export_up()
        self.probed = True
        return any(b.healthy for b in self)

    async def scrape_all(self, session: aiohttp.ClientSession, timeout_s: float) -> None:
        """Scrape every endpoint's /metrics once; keep the last good scrape."""
        await asyncio.gather(
            *(self._scrape(session, b, u, timeout_s) for b in self for u in b.upstreams)
        )
        for backend in self:
            self._export(backend)

    async def _scrape(
        self, session: aiohttp.ClientSession, backend: Backend, upstream: Upstream, timeout_s: float
    ) -> None:
        """Scrape one endpoint; a failed scrape, and each figure thrown away, is counted
        by its kind, and the last good scrape stays (it goes stale, then unknown)."""
        scrape = await scrape_once(session, upstream.url, backend.headers, timeout_s)
        faults = [scrape] if isinstance(scrape, str) else scrape.problems
        for kind in faults:
            self._metrics.scrape_errors.labels(
                backend.route.value, url_label(upstream.url), kind
            ).inc()
        if isinstance(scrape, str):
            self._metrics.upstream_errors.labels(backend.route.value, "scrape").inc()
            return
        if upstream.scrape is not None:
            window = acceptance_between(upstream.scrape, scrape)
            if window is not None:
                upstream.acceptance = window
        self.sources.window(
            backend.route, upstream.scrape, scrape, upstream.decode_log, upstream.inflight
        )
        upstream.others_before = _others(upstream)
        upstream.scrape = scrape
        upstream.inflight_at_scrape = upstream.inflight

    async def forget_own_load(self, session: aiohttp.ClientSession, timeout_s: float) -> None:
        """Scrape again once the profiler's requests have ended, and drop the scrape
        before: both counted them as other clients' requests, and two such scrapes in
        a row made the idle pair look carried by someone else (gateway/backends/live.py), so the
        first requests after the profile were consolidated and their shadow copies
        skipped (tests/gateway/test_ui_browser.py failed that way, 2026-12-04)."""
        await self.scrape_all(session, timeout_s)
        for backend in self:
            for upstream in backend.upstreams:
                upstream.others_before = None

    def _export(self, backend: Backend) -> None:
        name = backend.route.value
        state = backend.state(self._scrape_max_age_s)
        m = self._metrics
        for gauge, value in (
            (m.backend_running, state.running),
            (m.backend_waiting, state.waiting),
            (m.backend_kv_usage, state.kv_cache_usage),
        ):
            gauge.labels(name).set(float("nan") if value is None else value)
        windows = [u.acceptance for u in backend.upstreams if u.acceptance is not None]
        if windows:
            drafted = sum(w.draft_tokens for w in windows)
            rate = sum(w.rate * w.draft_tokens for w in windows) / drafted
            length = sum(w.mean_length * w.draft_tokens for w in windows) / drafted
            m.backend_acceptance.labels(name).set(rate)
            m.backend_acceptance_length.labels(name).set(length)

    async def run_scraper(
        self, session: aiohttp.ClientSession, interval_s: float, timeout_s: float
    ) -> None:
        """One scraping loop per endpoint, each restarted (and logged) if it raises: a
        slow or hostile server delays no other's scrapes and stops none for good."""
        self.sources.announce()

        def every_interval(backend: Backend, upstream: Upstream) -> Callable[[], Awaitable[None]]:
            async def loop() -> None:
                while True:
                    started = time.monotonic()
                    await self._scrape(session, backend, upstream, timeout_s)
                    self._export(backend)
                    await sleep_until_next(interval_s, started)

            return loop

        async with asyncio.TaskGroup() as group:
            for backend in self:
                for upstream in backend.upstreams:
                    url = url_label(upstream.url)
                    group.create_task(
                        supervised(
                            every_interval(backend, upstream),
                            interval_s,
                            task="scraper",
                            route=backend.route.value,
                            url=url,
                        ),
                        name=f"specroute-scraper-{backend.route.value}-{url}",
                    )

    async def run_prober(
        self, session: aiohttp.ClientSession, interval_s: float, timeout_s: float
    ) -> None:
        """Probe every interval_s, restarted (and logged) if a round raises: a dead
        prober would leave every endpoint with the health it last had."""

        async def loop() -> None:
            while True:
                await self.probe_all(session, timeout_s)
                await asyncio.sleep(interval_s)

        await supervised(loop, interval_s, task="health_prober")


async def _contained(
    session: aiohttp.ClientSession, backend: Backend, upstream: Upstream, timeout_s: float
) -> bool | None:
    """_probe's answer, or None when it raised (logged): one endpoint whose answer
    breaks the probe leaves every other endpoint's health current."""
    try:
        return await _probe(session, backend, upstream, timeout_s)
    except Exception:
        log.exception("health_probe_failed", route=backend.route.value, url=url_label(upstream.url))
        return None


async def _probe(
    session: aiohttp.ClientSession, backend: Backend, upstream: Upstream, timeout_s: float
) -> bool:
    try:
        async with session.get(
            f"{upstream.url}/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            ok = resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False
    if ok:
        cards = await model_cards(session, upstream.url, backend.headers, timeout_s)
        if note_models(upstream, cards):
            route, url = backend.route.value, url_label(upstream.url)
            log.info("backend_models", route=route, url=url, models=sorted(upstream.models or ()))
    return ok
