"""The two backends (speculative, baseline): endpoints, health, in-flight counts.

The router needs a cheap, always-current picture of load; the gateway's own
in-flight count per backend is that picture (it is exact and costs nothing),
and health probes say which endpoints may be used at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import aiohttp
import structlog

from classifier.policy import BackendState, LiveState, Route
from gateway.config import BackendConfig, BackendsConfig
from gateway.telemetry import Metrics

log = structlog.get_logger("specroute.backends")


@dataclass(slots=True)
class Upstream:
    """One vLLM server: a base URL (without /v1) and what we know of it."""

    url: str
    inflight: int = 0
    healthy: bool = True


@dataclass(slots=True)
class Backend:
    route: Route
    upstreams: list[Upstream]
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_config(cls, route: Route, config: BackendConfig) -> Backend:
        headers: dict[str, str] = {}
        if config.api_key_env and (key := os.environ.get(config.api_key_env)):
            headers["Authorization"] = f"Bearer {key}"
        return cls(route, [Upstream(url) for url in config.urls], headers)

    @property
    def inflight(self) -> int:
        return sum(u.inflight for u in self.upstreams)

    @property
    def healthy(self) -> bool:
        return any(u.healthy for u in self.upstreams)

    def pick(self) -> Upstream:
        """The least busy healthy endpoint (any endpoint if none is healthy)."""
        candidates = [u for u in self.upstreams if u.healthy] or self.upstreams
        return min(candidates, key=lambda u: u.inflight)

    def state(self) -> BackendState:
        return BackendState(inflight=self.inflight, healthy=self.healthy)


class BackendPool:
    def __init__(self, config: BackendsConfig, metrics: Metrics) -> None:
        self._metrics = metrics
        self._backends = {route: Backend.from_config(route, config.of(route)) for route in Route}
        for route in Route:
            metrics.inflight.labels(route.value).set(0)
            metrics.backend_up.labels(route.value).set(1)

    def of(self, route: Route) -> Backend:
        return self._backends[route]

    def __iter__(self) -> Iterator[Backend]:
        return iter(self._backends.values())

    def live_state(self) -> LiveState:
        return LiveState(
            speculative=self._backends[Route.SPECULATIVE].state(),
            baseline=self._backends[Route.BASELINE].state(),
        )

    @contextlib.contextmanager
    def track(self, backend: Backend, upstream: Upstream) -> Iterator[None]:
        """Count a request as in flight for exactly as long as the block runs."""
        upstream.inflight += 1
        gauge = self._metrics.inflight.labels(backend.route.value)
        gauge.inc()
        try:
            yield
        finally:
            upstream.inflight -= 1
            gauge.dec()

    async def probe_all(self, session: aiohttp.ClientSession, timeout_s: float) -> bool:
        """Probe every endpoint's /health now; True if any backend is healthy."""
        pairs = [(b, u) for b in self for u in b.upstreams]
        results = await asyncio.gather(*(_probe(session, u.url, timeout_s) for _, u in pairs))
        for (backend, upstream), ok in zip(pairs, results, strict=True):
            if ok != upstream.healthy:
                log.info("backend_health_changed", backend=backend.route.value, healthy=ok)
            upstream.healthy = ok
        for backend in self:
            self._metrics.backend_up.labels(backend.route.value).set(int(backend.healthy))
        return any(b.healthy for b in self)

    async def run_prober(
        self, session: aiohttp.ClientSession, interval_s: float, timeout_s: float
    ) -> None:
        while True:
            await self.probe_all(session, timeout_s)
            await asyncio.sleep(interval_s)


async def _probe(session: aiohttp.ClientSession, base_url: str, timeout_s: float) -> bool:
    try:
        async with session.get(
            f"{base_url}/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False
