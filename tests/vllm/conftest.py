"""Fixtures for the real-engine tier: a CPU vLLM pair started by deploy/cpu/up.sh.

The tier runs only when SPECROUTE_VLLM_BACKENDS names the two servers (without
it the tests skip on a developer machine and fail in CI):

    eval "$(deploy/cpu/up.sh | paste -sd, | sed 's/^/export SPECROUTE_VLLM_BACKENDS=/')"
    # i.e. SPECROUTE_VLLM_BACKENDS="speculative=http://127.0.0.1:8101,baseline=http://127.0.0.1:8102"
    pytest -m vllm tests/vllm

Both servers must serve the same model under the same name and be otherwise
idle while the tier runs (some tests compare /metrics counters before and
after one request).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from classifier.profile import EngineProfile
from classifier.tokens import load_tiktoken_counter
from gateway.app import create_app
from gateway.config import parse_config
from tests.support import skip_unless_ci
from tooling import interleave
from tooling.bench.targets import wait_for_profile
from tooling.local_stack import serve_app

ENV = "SPECROUTE_VLLM_BACKENDS"
ROUTES = ("speculative", "baseline")
# The three-route trio's third server (deploy/cpu/up.sh --ngram-k2: n-gram, k = 2).
NGRAM_K2_ENV = "SPECROUTE_VLLM_NGRAM_K2"
# The speculative server's twin without per-request metrics (up.sh --spec-off).
SPEC_OFF_ENV = "SPECROUTE_VLLM_SPEC_OFF"


@dataclass(frozen=True)
class Backends:
    speculative: str
    baseline: str
    model: str

    def url(self, route: str) -> str:
        return {"speculative": self.speculative, "baseline": self.baseline}[route]


def parse_backends(value: str) -> dict[str, str]:
    """'speculative=URL,baseline=URL' -> {'speculative': URL, 'baseline': URL}."""
    out: dict[str, str] = {}
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, url = part.partition("=")
        name, url = name.strip(), url.strip().rstrip("/")
        if not sep or name not in ROUTES or not url.startswith(("http://", "https://")):
            raise ValueError(f"bad {ENV} entry {part!r}: want 'speculative=URL,baseline=URL'")
        out[name] = url
    missing = [r for r in ROUTES if r not in out]
    if missing:
        raise ValueError(f"{ENV} lacks {', '.join(missing)}: want 'speculative=URL,baseline=URL'")
    return out


def backends_configured() -> bool:
    return bool(os.environ.get(ENV, "").strip())


def _get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=10) as r:
        data = json.load(r)
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="session")
def backends() -> Backends:
    if not backends_configured():
        skip_unless_ci(f"{ENV} not set (deploy/cpu/run_tier.sh starts the pair and sets it)")
    urls = parse_backends(os.environ[ENV])
    models: dict[str, list[str]] = {}
    for route, url in urls.items():
        try:
            listing = _get_json(url + "/v1/models")
        except (urllib.error.URLError, OSError) as e:
            pytest.fail(f"{route} backend {url} does not answer /v1/models: {e}")
        data = listing["data"]
        assert isinstance(data, list)
        models[route] = [m["id"] for m in data]
    assert models["speculative"] == models["baseline"], f"the two servers differ: {models}"
    assert len(models["speculative"]) == 1, models
    return Backends(
        speculative=urls["speculative"],
        baseline=urls["baseline"],
        model=models["speculative"][0],
    )


@dataclass(frozen=True)
class Trio:
    """The tier's three routes (issue 42), by route name in route order: "none" (the
    pair's baseline), "ngram-k4" (the pair's speculative server) and "ngram-k2"."""

    urls: Mapping[str, str]
    k: Mapping[str, int]
    model: str


def extra_server(env: str, name: str, model: str) -> str:
    """The URL of one more server run_tier.sh started (in `env`), checked to serve `model`."""
    url = os.environ.get(env, "").strip().rstrip("/")
    if not url:
        skip_unless_ci(f"{env} not set (deploy/cpu/run_tier.sh starts the {name} server)")
    try:
        listing = _get_json(url + "/v1/models")
    except (urllib.error.URLError, OSError) as e:
        pytest.fail(f"{name} backend {url} does not answer /v1/models: {e}")
    data = listing["data"]
    assert isinstance(data, list)
    assert [m["id"] for m in data] == [model], f"{name} serves {data}"
    return url


@pytest.fixture(scope="session")
def trio(backends: Backends) -> Trio:
    url = extra_server(NGRAM_K2_ENV, "ngram-k2", backends.model)
    return Trio(
        urls={"none": backends.baseline, "ngram-k4": backends.speculative, "ngram-k2": url},
        k={"none": 0, "ngram-k4": 4, "ngram-k2": 2},  # deploy/cpu/up.sh
        model=backends.model,
    )


@dataclass(frozen=True)
class TrioProfile:
    """The tier's one engine profile of the trio, measured by a cold default gateway."""

    path: Path  # the JSON file that gateway saved (routing.profile_path)
    profile: EngineProfile  # that file, read back
    in_use: Mapping[str, Any]  # the profile the gateway then used, from its /stats
    waited_s: float  # from the gateway's start until it was in use


# A cold gateway's profile of three CPU servers: 2-10 minutes on the 2-core machine.
PROFILE_TIMEOUT_S = 1200


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def trio_profile(trio: Trio, tmp_path_factory: pytest.TempPathFactory) -> TrioProfile:
    """A cold gateway with the defaults and the trio's three [routes.NAME] tables
    profiles the servers once for the whole tier: the profiler's own test reads it,
    and the gateways of the routing tests load it from its file, as a restarted
    gateway does (each profiling took 6-10 minutes on the 2-core machine). The
    servers are idle: a session fixture, first set up by whichever test needs it."""
    path = tmp_path_factory.mktemp("profile") / "trio.json"
    tables = interleave.route_tables(trio.urls, trio.k)
    config = parse_config({"routes": tables, "routing": {"profile_path": str(path)}})
    runner, gateway = await serve_app(create_app(config, tokens=load_tiktoken_counter()))
    try:
        started = time.monotonic()
        await wait_for_profile(aiohttp.ClientSession, gateway, sys.stdout, PROFILE_TIMEOUT_S)
        waited = time.monotonic() - started
        async with aiohttp.ClientSession() as http, http.get(gateway + "/stats") as resp:
            stats = (await resp.json())["profile"]
    finally:
        await runner.cleanup()
    assert stats["in_use"], f"no profile of the trio after {PROFILE_TIMEOUT_S} s"
    print(f"profile of the trio in after {waited:.0f} s")
    return TrioProfile(path, EngineProfile.loads(path.read_text()), stats["profile"], waited)


# ---- Prometheus text parsing (just enough for vLLM's /metrics) ----

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

LabelSet = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Scrape:
    samples: Mapping[tuple[str, LabelSet], float]
    types: Mapping[str, str]

    def get(self, name: str, **labels: str) -> float:
        """Sum of the samples named `name` whose labels include `labels`."""
        want = set(labels.items())
        found = [v for (n, ls), v in self.samples.items() if n == name and want <= ls]
        if not found:
            raise KeyError(f"no sample {name}{labels or ''}")
        return sum(found)

    def has(self, name: str) -> bool:
        return any(n == name for n, _ in self.samples)

    def names(self, prefix: str = "") -> set[str]:
        return {n for n, _ in self.samples if n.startswith(prefix)}


def parse_metrics(text: str) -> Scrape:
    samples: dict[tuple[str, LabelSet], float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(None, 3)
            types[name] = typ.strip()
            continue
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ValueError(f"unparsable metrics line: {line!r}")
        labels: LabelSet = frozenset(_LABEL.findall(m.group(3) or ""))
        samples[(m.group(1), labels)] = float(m.group(4))
    return Scrape(samples=samples, types=types)


# ---- async fixtures ----


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=60)
    # vLLM's server (uvicorn) closes a connection idle for 5 s; aiohttp keeps one 15 s by
    # default, so a request after a longer settle could be written onto a connection the
    # server was closing ("Cannot write to closing transport" while priming, a fresh
    # clone on 2026-12-07). Idle connections are dropped here first.
    connector = aiohttp.TCPConnector(keepalive_timeout=2.0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        yield session


@pytest.fixture
def scrape(http: aiohttp.ClientSession) -> Callable[[str], Awaitable[Scrape]]:
    async def _scrape(base_url: str) -> Scrape:
        async with http.get(base_url + "/metrics") as r:
            assert r.status == 200, r.status
            return parse_metrics(await r.text())

    return _scrape


@pytest.fixture
async def quiet_gateway(backends: Backends) -> AsyncIterator[str]:
    """A gateway that sends nothing of its own: no start-up profile (policy "rules"),
    no shadow copies. These tests compare vLLM's counters over windows that must hold
    their own requests only (tests/vllm/test_shadow_real_vllm.py has shadows on)."""
    config = parse_config(
        {
            "backends": {
                "speculative": {"urls": [backends.speculative], "num_speculative_tokens": 4},
                "baseline": {"urls": [backends.baseline]},
            },
            "upstream": {"scrape_interval_s": 0.5},
            "shadow": {"enabled": False},
            "routing": {"policy": "rules"},
        }
    )
    runner, url = await serve_app(create_app(config, tokens=load_tiktoken_counter()))
    try:
        yield url
    finally:
        await runner.cleanup()


# ---- timing targets interleaved (tooling/interleave.py), failing the test on the way ----


async def settle(
    http: aiohttp.ClientSession, urls: Iterable[str], *gateways: web.Application
) -> None:
    """The servers idle, no shadow copy pending, each gateway's view scraped now."""
    if not await interleave.idle(http, urls, gateways):
        pytest.fail("the servers did not go idle within 120 s")


async def primed(http: aiohttp.ClientSession, urls: Iterable[str], body: dict[str, Any]) -> None:
    statuses = await interleave.prime(http, urls, body)
    assert set(statuses.values()) == {200}, statuses


async def timed_ok(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], route: str | None = None
) -> tuple[float, interleave.Answer]:
    """A 200 answer's seconds and the answer (the gateway's route and reason)."""
    answer = await interleave.timed(http, url, body, route)
    assert answer.seconds is not None, f"HTTP {answer.status}: {answer.error}"
    return answer.seconds, answer
