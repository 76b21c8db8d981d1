"""The stack under test: the emulated pair (or N emulated servers, one per route),
`specroute ext-proc` in-process, and a real Envoy (a subprocess) on the shipped
bootstrap (its N-route form for N), all on 127.0.0.1 ephemeral ports."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from classifier.tokens import TokenCounter, load_tiktoken_counter
from gateway.config import parse_config
from gateway.extproc.server import Running, start
from gateway.extproc.stream import Mode
from tests.support import require_tool
from tooling.emulator import EmulatorConfig, SharedGpu, create_emulator_app
from tooling.envoy import (
    ADMIN,
    BASELINE,
    ENDPOINT_BOOTSTRAP,
    INSTALL,
    LISTENER,
    PICKER,
    POOL_BOOTSTRAP,
    SPECULATIVE,
    Envoy,
    picker_in,
    render,
    render_routes,
    run_envoy,
)
from tooling.local_stack import MODEL, gateway_config

TIME_SCALE = 0.05


@dataclass(slots=True)
class Stack:
    envoy: Envoy
    picker: Running
    spec_url: str
    base_url: str
    runners: dict[str, web.AppRunner]

    async def kill(self, route: str) -> None:
        """Stop one emulated server (its connections close, as a killed process's do)."""
        await self.runners.pop(route).cleanup()


StackFactory = Callable[..., Awaitable[Stack]]


@pytest.fixture(scope="session")
def tokens() -> TokenCounter:
    return load_tiktoken_counter("cl100k_base")


async def serve_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """An emulated server whose stop is a kill: handlers still running 0.1 s after it
    are cancelled, their connections closed mid-answer."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    return runner, f"http://127.0.0.1:{sock.getsockname()[1]}"


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.fixture
async def stack_for(tmp_path: Path, tokens: TokenCounter) -> AsyncIterator[StackFactory]:
    """make(mode=..., bootstrap=..., **config sections) -> a running Stack."""
    require_tool("envoy", INSTALL)  # a loud skip here, a failure in CI
    async with contextlib.AsyncExitStack() as exits:

        async def make(*, mode: Mode = Mode.POOL, picker_up: bool = True, **sections: Any) -> Stack:
            spec_cfg = EmulatorConfig(
                mode="speculative", model=MODEL, time_scale=TIME_SCALE,
                per_request_spec_decode_metrics="summary",
            )  # fmt: skip
            base_cfg = EmulatorConfig(mode="baseline", model=MODEL, time_scale=TIME_SCALE)
            gpu = SharedGpu()
            runners: dict[str, web.AppRunner] = {}
            spec_runner, spec_url = await serve_app(create_emulator_app(spec_cfg, gpu))
            base_runner, base_url = await serve_app(create_emulator_app(base_cfg, gpu))
            runners.update(speculative=spec_runner, baseline=base_runner)

            async def stop_servers() -> None:
                for runner in runners.values():
                    await runner.cleanup()

            exits.push_async_callback(stop_servers)
            sections.setdefault("routing", {"policy": "rules"})
            sections.setdefault("upstream", {"health_interval_s": 0.2, "scrape_interval_s": 0.5})
            config = gateway_config(spec_url, base_url, spec_cfg, **sections)
            picker = await start(config, mode=mode, tokens=tokens)
            exits.push_async_callback(picker.stop)
            grpc_port = picker.grpc_port
            if not picker_up:
                await picker.stop()
            bootstrap = POOL_BOOTSTRAP if mode is Mode.POOL else ENDPOINT_BOOTSTRAP
            ports = {
                SPECULATIVE: _port(spec_url), BASELINE: _port(base_url),
                PICKER: grpc_port, LISTENER: 0, ADMIN: 0,
            }  # fmt: skip
            rendered = render(bootstrap, ports, tmp_path / "envoy.json")
            envoy = await exits.enter_async_context(run_envoy(rendered, tmp_path))
            if picker_up:
                await picker_in(envoy.admin)  # else the first requests would fail open
            return Stack(envoy, picker, spec_url, base_url, runners)

        yield make


# Three routes of one model, as on a CPU host: no speculation, n-gram k=2 and k=4
# (their emulators draft as many tokens per step as the route says).
THREE_ROUTES = {"none": 0, "ngram-k2": 2, "ngram-k4": 4}


@dataclass(slots=True)
class RoutesStack:
    envoy: Envoy
    picker: Running
    urls: dict[str, str]  # route -> its one emulated server
    runners: dict[str, web.AppRunner]

    async def kill(self, route: str) -> None:
        await self.runners.pop(route).cleanup()


RoutesFactory = Callable[..., Awaitable[RoutesStack]]


@pytest.fixture
async def routes_stack_for(tmp_path: Path, tokens: TokenCounter) -> AsyncIterator[RoutesFactory]:
    """make(routes={name: k}, **config sections) -> N emulated servers on one emulated
    GPU, the picker on [routes.NAME] tables, Envoy on the N-route pool bootstrap."""
    require_tool("envoy", INSTALL)
    async with contextlib.AsyncExitStack() as exits:

        async def make(routes: dict[str, int] = THREE_ROUTES, **sections: Any) -> RoutesStack:
            gpu = SharedGpu()
            runners: dict[str, web.AppRunner] = {}
            urls: dict[str, str] = {}

            async def stop_servers() -> None:
                for runner in runners.values():
                    await runner.cleanup()

            exits.push_async_callback(stop_servers)
            tables: dict[str, Any] = {}
            for name, k in routes.items():
                emulator = (
                    EmulatorConfig(mode="speculative", model=MODEL, time_scale=TIME_SCALE,
                                   num_speculative_tokens=k,
                                   per_request_spec_decode_metrics="summary")
                    if k else EmulatorConfig(mode="baseline", model=MODEL, time_scale=TIME_SCALE)
                )  # fmt: skip
                runners[name], urls[name] = await serve_app(create_emulator_app(emulator, gpu))
                tables[name] = {"urls": [urls[name]], "method": "ngram" if k else "none"}
                if k:
                    tables[name]["num_speculative_tokens"] = k
            raw: dict[str, Any] = {
                "routes": tables,
                "routing": {"policy": "rules"},
                "upstream": {"health_interval_s": 0.2, "scrape_interval_s": 0.5},
            }
            for section, values in sections.items():
                raw[section] = {**raw.get(section, {}), **values}
            picker = await start(parse_config(raw), mode=Mode.POOL, tokens=tokens)
            exits.push_async_callback(picker.stop)
            default = next(name for name, k in routes.items() if not k)
            rendered = render_routes(
                tmp_path / "envoy.json", {name: _port(url) for name, url in urls.items()},
                default=default, picker=picker.grpc_port, listener=0, admin=0,
            )  # fmt: skip
            envoy = await exits.enter_async_context(run_envoy(rendered, tmp_path))
            await picker_in(envoy.admin)
            return RoutesStack(envoy, picker, urls, runners)

        yield make
