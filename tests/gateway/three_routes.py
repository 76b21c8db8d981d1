"""Three configured routes for the tests of /stats, /decide and /ui: "none" (no
speculation), "ngram-k2" and "ngram-k4" ([routes.NAME] tables, in that order).

Two ways: a config over any three URLs (fake upstreams), and three emulated vLLM
servers on one emulated GPU with the gateway in front, all on 127.0.0.1 ephemeral
ports, run as production runs them (tooling/local_stack.serve_app).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.config import Config, parse_config
from tooling.emulator import EmulatorConfig, SharedGpu, create_emulator_app
from tooling.emulator.costs import draft_cost_ratio
from tooling.local_stack import MODEL, serve_app

NAMES = ("none", "ngram-k2", "ngram-k4")
K = {"none": 0, "ngram-k2": 2, "ngram-k4": 4}
SPECULATIVE = ("ngram-k2", "ngram-k4")


def name_of(k: int) -> str:
    """The tests' name of a route with an n-gram drafter of k (0: "none")."""
    return f"ngram-k{k}" if k else "none"


def three_routes_config(
    urls: Sequence[str],
    costs: dict[str, float] | None = None,
    ks: Sequence[int] = (0, 2, 4),
    sections: Mapping[str, dict[str, Any]] | None = None,
    devices: Mapping[str, str] | None = None,
) -> Config:
    """A route per k of `ks` (by default [routes.none], [routes.ngram-k2],
    [routes.ngram-k4]) on `urls` in that order, each speculative route's
    draft_cost_ratio from `costs` (absent: the default), its `device` from `devices`
    (absent: none said), other sections as given (merged over short upstream timeouts)."""

    def route(k: int, url: str) -> dict[str, Any]:
        device = {"device": devices[name_of(k)]} if devices else {}
        if not k:
            return {"urls": [url], "method": "none", **device}
        cost = {"draft_cost_ratio": costs[name_of(k)]} if costs and name_of(k) in costs else {}
        return {"urls": [url], "method": "ngram", "num_speculative_tokens": k, **cost, **device}

    raw: dict[str, Any] = {
        "routes": {name_of(k): route(k, url) for k, url in zip(ks, urls, strict=True)},
        "upstream": {"health_interval_s": 0.2, "connect_timeout_s": 1.0, "read_timeout_s": 5.0},
    }
    for section, values in (sections or {}).items():
        raw[section] = {**raw.get(section, {}), **values}
    return parse_config(raw)


@dataclass(frozen=True, slots=True)
class ThreeRouteStack:
    gateway: str
    servers: dict[str, str]  # route name -> its emulated server's URL
    app: web.Application  # the gateway's


@contextlib.asynccontextmanager
async def three_route_stack(
    *,
    time_scale: float,
    tokens: TokenCounter,
    ks: Sequence[int] = (0, 2, 4),
    devices: Mapping[str, str] | None = None,
    **sections: dict[str, Any],
) -> AsyncIterator[ThreeRouteStack]:
    """Emulated servers of one model on one emulated GPU (as deployed on one), a route
    each: by default no speculation, an n-gram drafter with k=2 and with k=4, each
    drafter reporting vLLM's per-request speculative metrics; the gateway told each
    route's k and c. With `devices` (route name -> device), an emulated GPU per device,
    the routes of one device time-sliced on it, and the gateway told so."""
    plain = EmulatorConfig(mode="baseline", model=MODEL, time_scale=time_scale)
    emulators = {
        name_of(k): replace(
            plain,
            mode="speculative",
            drafter="ngram",
            num_speculative_tokens=k,
            per_request_spec_decode_metrics="summary",
        )
        if k
        else plain
        for k in ks
    }
    gpus = {device: SharedGpu() for device in sorted(set((devices or {"": ""}).values()))}
    runners: list[web.AppRunner] = []
    try:
        servers: dict[str, str] = {}
        for name, emulator in emulators.items():
            gpu = gpus[devices[name] if devices else ""]
            runner, servers[name] = await serve_app(create_emulator_app(emulator, gpu))
            runners.append(runner)
        config = three_routes_config(
            list(servers.values()),
            {name: draft_cost_ratio(e) for name, e in emulators.items() if e.speculative},
            ks,
            {"upstream": {"scrape_interval_s": 0.5, "health_interval_s": 1.0}, **sections},
            devices,
        )
        app = create_app(config, tokens=tokens)
        runner, gateway = await serve_app(app)
        runners.append(runner)
        yield ThreeRouteStack(gateway, servers, app)
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
