"""Shadow copies: both routes measured on the same request, in idle GPU time only.

A sampled share (`[shadow] share`) of finished, successful user requests that
ran alone on their GPU (nothing else in flight there as each was sent and as it
ended: the only ones a copy can be compared with; the others count as skipped)
is queued for a copy to the route that was not chosen (gateway/shadow/copy.py
says how the copy is made comparable). A copy starts only when it costs users
nothing:

- one GPU for the pair (as the policy has measured or been told; assumed while
  it measures): no user request in flight on either server of the pair;
- a GPU each: none on the server the copy goes to;
- and in both, none for `_SETTLE_S` before (a closed-loop client's next request
  is milliseconds behind its last), no other clients' requests there as of the
  last scrape, no guard (KV pressure, a busy speculative server) and every
  server of the pair healthy.

A user request sent to a server a running shadow would slow (one GPU: either
server of the pair; a GPU each: the shadow's server) cancels it at once: the
connection is closed and vLLM aborts. So does a scrape that shows another
client's requests there (another replica's, or sent directly), a server leaving
rotation, and a drain. At most `max_inflight` run; the queue keeps the newest `_PENDING_MAX`
for at most `_MAX_AGE_S`; what is dropped is counted as skipped.

Shadows hold nothing a user needs: they are not in the backends' in-flight
counts (admission, the router's load, the drain), not in the user metrics, the
request log or the recorder. Their answers are read for timing and dropped.
A scrape that caught a shadow running counts it as another client's request;
`caught` says so, and gateway/backends/live.py takes it back out of what the router
sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from dataclasses import dataclass

import aiohttp
import structlog

from classifier.types import LiveState, Route
from gateway.backends.live import pair_state
from gateway.backends.pool import BackendPool, Upstream
from gateway.backends.scraper import Scrape
from gateway.config import ShadowConfig
from gateway.outcomes.learning import learn_shadow
from gateway.outcomes.outcome_log import OutcomeLog
from gateway.runtime import Runtime
from gateway.shadow.copy import (
    Primary,
    ShadowAnswer,
    ShadowFailed,
    answer_of,
    path_of,
    primary_of,
    send,
    shadow_body,
    traced,
)
from gateway.shadow.results import PairTotals, paired, shadow_lesson, shadow_line
from gateway.telemetry import Metrics
from gateway.wire.life import RequestRecord
from gateway.wire.tracing import Tracing

log = structlog.get_logger("specroute.shadow")

_SETTLE_S = 0.05  # the pair's GPU idle this long before a shadow starts
_PENDING_MAX = 16
_MAX_AGE_S = 30.0  # a queued copy not started by then is skipped
_TICK_S = 0.05  # how often the queue is looked at while it holds something
COMPLETED, CANCELLED, SKIPPED, FAILED = "completed", "cancelled", "skipped", "failed"


@dataclass(frozen=True, slots=True)
class _Queued:
    primary: Primary
    route: Route  # the shadow's: the one not chosen
    body: bytes
    queued_at: float  # monotonic


@dataclass(slots=True)
class _Running:
    queued: _Queued
    upstream: Upstream
    scrape_at_start: Scrape | None  # a newer scrape of its server saw it running
    state: LiveState  # its pair's, as it was sent: the load its lesson met
    ended: bool = False


class ShadowRunner:
    """The app's shadow copies: queue, gate, run, cancel, and account for them."""

    def __init__(
        self,
        config: ShadowConfig,
        pool: BackendPool,
        metrics: Metrics,
        runtime: Runtime,
        *,
        seed: int = 0,
        settle_s: float = _SETTLE_S,
    ) -> None:
        self._config = config
        self._pool = pool
        self._metrics = metrics
        self._runtime = runtime
        self._settle_s = settle_s
        self._rng = random.Random(seed)
        self._queue: deque[_Queued] = deque()
        self._running: dict[asyncio.Task[None], _Running] = {}
        self._busy_at: dict[str, float] = {}  # server URL -> last user arrival or finish
        self._seen: dict[str, tuple[Scrape | None, int]] = {}  # ended shadows a scrape saw
        self._wake = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self._outcomes: OutcomeLog | None = None
        self._tracing: Tracing | None = None
        self._loop: asyncio.Task[None] | None = None
        self.totals = PairTotals(metrics)
        metrics.shadow_inflight.set(0)

    # ---- lifecycle (the app's cleanup_ctx) -----------------------------------------

    def start(
        self, session: aiohttp.ClientSession, log: OutcomeLog | None, tracing: Tracing | None = None
    ) -> None:
        """Run the loop (if enabled); `log`: where each shadow's line goes, if anywhere;
        `tracing`: the app's (a copy's span, gateway/wire/tracing.py)."""
        self._session, self._outcomes, self._tracing = session, log, tracing
        if self._config.enabled:
            self._loop = asyncio.create_task(self._run_loop(), name="specroute-shadows")

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        tasks = list(self._running)
        self._stop_all()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def pending(self) -> int:
        """Copies queued or running: a benchmark that times direct requests beside the
        gateway waits for none, since a copy cannot see load that bypasses the gateway."""
        return len(self._queue) + len(self._running)

    # ---- hooks on the user's request path ------------------------------------------

    def offer(self, record: RequestRecord) -> None:
        """A user request ended (any way): note the server's activity, and maybe queue
        a copy of it for the route it was not sent to."""
        if record.route is not None:
            now = time.monotonic()
            for upstream in self._pool.pairs[record.pair].of(record.route):
                self._busy_at[upstream.url] = now
        if self._loop is None or self._config.share <= 0:
            return
        primary = primary_of(record)
        if primary is None or self._rng.random() >= self._config.share:
            return
        if not self._ran_alone(primary):
            # It shared its GPU: no comparable pair, and no idle time to copy it in.
            self._count(primary, SKIPPED)
            return
        try:
            body = shadow_body(record.body, primary.completion_tokens)
        except (ValueError, RecursionError):  # in the handler's finally: never a traceback
            self._count(primary, SKIPPED)
            return
        if len(self._queue) >= _PENDING_MAX:
            self._count(self._queue.popleft().primary, SKIPPED)
        # One of the routes it was not sent to, drawn evenly: copies spread over them.
        others = [b.route for b in self._pool if b.route != primary.route]
        if not others:
            return
        target = others[0] if len(others) == 1 else self._rng.choice(others)
        self._queue.append(_Queued(primary, target, body, time.monotonic()))
        self._wake.set()

    def user_arrived(self, upstream: Upstream) -> None:
        """A user request is being sent to `upstream`: cancel what it would wait for."""
        self._busy_at[upstream.url] = time.monotonic()
        if not self._running:
            return
        shared = self._shared(upstream.pair)
        for task, run in list(self._running.items()):
            if run.upstream.pair == upstream.pair and (shared or run.upstream is upstream):
                self._cancel(task, run)

    def caught(self, pair: int) -> dict[Route, int]:
        """Per route of `pair`, the shadows a scrape caught running there (counted as
        other clients' requests, which they are not: gateway/backends/live.py takes
        them back out of the state a decision reads)."""
        if not self._running and not self._seen:
            return {}
        p = self._pool.pairs[pair]
        return {route: sum(self._ghosts(u) for u in ups) for route, ups in p.endpoints.items()}

    # ---- the loop: start what may start, stop what must stop ------------------------

    async def _run_loop(self) -> None:
        while True:
            self._tick()
            if self._queue or self._running:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_TICK_S):
                        await self._wake.wait()
            else:
                await self._wake.wait()
            self._wake.clear()

    def _tick(self) -> None:
        if self._runtime.draining:
            self._stop_all()
            return
        for task, run in list(self._running.items()):
            if not self._pair_healthy(run.upstream.pair) or self._others_on(run):
                self._cancel(task, run)
        now = time.monotonic()
        for queued in list(self._queue):
            if len(self._running) >= self._config.max_inflight:
                break
            if now - queued.queued_at > _MAX_AGE_S or not self._pair_healthy(queued.primary.pair):
                self._queue.remove(queued)
                self._count(queued.primary, SKIPPED)
                continue
            upstream = self._idle_server(queued, now)
            if upstream is not None:
                self._queue.remove(queued)
                self._launch(queued, upstream)

    def _idle_server(self, queued: _Queued, now: float) -> Upstream | None:
        """The pair's server of the shadow's route, if a shadow may start there now."""
        index = queued.primary.pair
        pair = self._pool.pairs[index]
        state = pair_state(self._pool, index, self)
        config = self._runtime.current.config
        guards = config.routing.guards
        if any(
            guards.reason(state.of(r)) is not None
            for r, c in config.routes.items()
            if c.speculative
        ):
            return None
        shared = self._shared(index)
        routes = state.routes if shared else (queued.route,)
        servers = [u for route in routes for u in pair.of(route)]
        if any(u.inflight for u in servers) or any(
            run.upstream in servers for run in self._running.values()
        ):
            return None
        if any((state.of(route).others or 0) > 0 for route in routes):
            return None  # other clients' requests, as of the last scrape
        if any(now - self._busy_at.get(u.url, -1e9) < self._settle_s for u in servers):
            return None
        return next((u for u in pair.of(queued.route) if u.healthy), None)

    def _launch(self, queued: _Queued, upstream: Upstream) -> None:
        state = pair_state(self._pool, queued.primary.pair, self)
        run = _Running(queued, upstream, upstream.scrape, state)
        task = asyncio.create_task(self._shadow(run), name="specroute-shadow")
        task.add_done_callback(lambda t: self._finished(t, run))
        self._running[task] = run
        self._metrics.shadow_inflight.set(len(self._running))

    async def _shadow(self, run: _Running) -> None:
        queued, upstream = run.queued, run.upstream
        features = queued.primary.features
        assert self._session is not None
        config = self._runtime.current.config
        headers = {
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
            "X-Request-Id": f"{queued.primary.request_id}-shadow",
            **self._pool.of(queued.route).headers,
        }
        decode = upstream.decode_log  # its drafts are ours: the counter attribution sees them
        handle = decode.begin(
            features.workload.value, 1, None if features.stream else time.monotonic()
        )
        url = upstream.url + path_of(features)
        try:
            with traced(self._tracing, queued.primary, queued.route, url) as call:
                measured = await send(
                    self._session,
                    url,
                    queued.body,
                    {**headers, **call.headers},
                    stream=features.stream,
                    read_timeout_s=config.upstream.read_timeout_s,
                    connect_timeout_s=config.upstream.connect_timeout_s,
                    on_first_token=lambda: decode.decoding(handle, time.monotonic()),
                )
        except ShadowFailed as exc:
            self._end(run, FAILED)
            log.info("shadow_failed", backend=queued.route.value, why=str(exc))
            return
        finally:
            decode.end(handle, time.monotonic())
            self._wake.set()
        if run.ended:  # cancelled just as it finished
            return
        k = (
            config.routes[queued.route].num_speculative_tokens
            if queued.route in config.routes
            else 0
        )
        answer = answer_of(measured, queued.route, features, k, self._pool.sources.attributed_rate)
        self._end(run, COMPLETED, answer)

    # ---- endings --------------------------------------------------------------------

    def _end(self, run: _Running, outcome: str, answer: ShadowAnswer | None = None) -> None:
        """Account for a shadow that stopped, once: metrics, the scrape's ghost, the pair."""
        if run.ended:
            return
        run.ended = True
        for task, other in list(self._running.items()):
            if other is run:
                del self._running[task]
        self._metrics.shadow_inflight.set(len(self._running))
        upstream = run.upstream
        if upstream.scrape is not run.scrape_at_start:
            seen = self._seen.get(upstream.url)
            before = seen[1] if seen is not None and seen[0] is upstream.scrape else 0
            self._seen[upstream.url] = (upstream.scrape, before + 1)
        primary, route = run.queued.primary, run.queued.route
        self._count(primary, outcome)
        config = self._runtime.current.config
        speculative = {r for r, c in config.routes.items() if c.speculative}
        timing = paired(primary, route, answer, speculative) if answer is not None else None
        if timing is not None:
            self.totals.add(primary.features.workload.value, timing)
        if answer is not None and (lesson := shadow_lesson(primary, route, run.state, answer)):
            learn_shadow(self._runtime.current.policy, self._metrics, lesson)
        if self._outcomes is not None:
            line = shadow_line(primary, route, outcome, answer, timing is not None, speculative)
            self._outcomes.write(line)

    def _finished(self, task: asyncio.Task[None], run: _Running) -> None:
        """A shadow's task ended: one that raised (a bug) is logged and counted failed."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("shadow_error", error=type(exc).__name__, detail=str(exc))
        self._end(run, FAILED)  # a no-op for one already accounted for

    def _cancel(self, task: asyncio.Task[None], run: _Running) -> None:
        self._end(run, CANCELLED)
        task.cancel()

    def _stop_all(self) -> None:
        for task, run in list(self._running.items()):
            self._cancel(task, run)
        while self._queue:
            self._count(self._queue.popleft().primary, SKIPPED)

    def _count(self, primary: Primary, outcome: str) -> None:
        self._metrics.shadow_requests.labels(primary.features.workload.value, outcome).inc()

    # ---- what the pair looks like ---------------------------------------------------

    def _shared(self, pair: int) -> bool:
        """One GPU for the pair: as the profile measured it; assumed until it is in."""
        shared = self._runtime.current.policy.shared_gpu(pair)
        return True if shared is None else shared

    def _pair_healthy(self, pair: int) -> bool:
        return all(u.healthy for u in self._pool.pairs[pair].upstreams)

    def _others_on(self, run: _Running) -> bool:
        """Another client's requests (another replica's, direct ones) on the GPU a running
        shadow uses, as of the last scrape (the shadows it caught taken out): it no
        longer runs in idle time.
        user_arrived() sees only this gateway's requests; on one time-sliced GPU a shadow
        left running beside another client's batch halves that batch's speed (policy vs
        oracle at c=8, four gateways on one emulated pair: 1.056x the better static
        route with shadows, 1.004x without, the same routes)."""
        index = run.upstream.pair
        state = pair_state(self._pool, index, self)  # none there when it started
        routes = state.routes if self._shared(index) else (run.queued.route,)
        return any((state.of(route).others or 0) > 0 for route in routes)

    def _ran_alone(self, primary: Primary) -> bool:
        """Nothing else in flight on its GPU as it ended (as it was sent: `alone`)."""
        pair = self._pool.pairs[primary.pair]
        shared = self._shared(primary.pair)
        servers = pair.upstreams if shared else pair.of(primary.route)
        return primary.alone and not any(u.inflight for u in servers)

    def _ghosts(self, upstream: Upstream) -> int:
        """Shadows its last scrape counted as running there."""
        n = sum(
            1
            for run in self._running.values()
            if run.upstream is upstream and upstream.scrape is not run.scrape_at_start
        )
        seen = self._seen.get(upstream.url)
        if seen is not None:
            if seen[0] is upstream.scrape:
                n += seen[1]
            else:  # a newer scrape: those shadows had ended, it saw none of them
                del self._seen[upstream.url]  # so `caught` goes back to its early return
        return n
