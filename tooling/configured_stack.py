"""A user's config on emulated servers: `specroute serve --emulate --config FILE`.

Each route of the config ([routes.NAME], or the two [backends] tables) gets an emulated
vLLM server per URL that runs what its table says: the GPU profile's drafter for the
route's `method` (the profile names each drafter's vLLM method) with the route's k, or
no speculation. The routes share one emulated GPU, as deployed on one; routes that name
a `device` share that device's GPU, and with by-index pairs URL i of every route sits on
GPU i. The gateway then runs the config itself, each URL replaced by its emulated
server's, so the page, /decide and /stats show the routes a user configured.

What the config would write (the outcome log, the recording, the profile and the
router's state) is not written: emulated figures must not mix with a real run's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from aiohttp import web

from classifier.tokens import TokenCounter
from classifier.types import Route
from gateway.app import create_app
from gateway.config import (
    Config,
    ConfigError,
    OutcomeLogConfig,
    Pairing,
    RecordConfig,
    RouteConfig,
    check_routes,
)
from tooling.emulator import EmulatorConfig, SharedGpu, create_emulator_app
from tooling.emulator.config import DEFAULT_GPU_PROFILE, ROOFLINE
from tooling.emulator.costs import describe_gpu
from tooling.emulator.gpu.profile import load_gpu_profile
from tooling.local_stack import MODEL, serve_app

# The files a config may name that the emulated run leaves alone.
NOT_WRITTEN = ("outcome_log.path", "record.path", "routing.profile_path", "routing.state_path")


@dataclass(frozen=True, slots=True)
class ConfiguredStack:
    gateway: str
    config: Config  # as the gateway runs it: the emulated servers' URLs
    emulators: dict[Route, EmulatorConfig]  # each route's servers' knobs
    gpus: dict[Route, tuple[str, ...]]  # each route's servers' emulated GPUs, by URL


def drafter_for(method: str, gpu_profile: str) -> str:
    """The profile's drafter that runs vLLM's speculative `method` (its own name also
    does); ValueError naming what the profile measured."""
    measured = DEFAULT_GPU_PROFILE if gpu_profile == ROOFLINE else gpu_profile  # its drafters
    drafters = load_gpu_profile(measured).drafters
    for name, drafter in drafters.items():
        if method in (drafter.method, name):
            return name
    have = ", ".join(f"{d.method} ({n})" for n, d in drafters.items()) or "none"
    raise ValueError(
        f"method {method!r}: GPU profile {gpu_profile} measured no drafter for it "
        f"(methods it has: {have})"
    )


def route_emulator(name: Route, route: RouteConfig, plain: EmulatorConfig) -> EmulatorConfig:
    """What a route's emulated server runs: its method's drafter and its k, or nothing."""
    if not route.speculative:
        return plain
    try:
        drafter = drafter_for(route.method, plain.gpu_profile)
        schedule = route.num_speculative_tokens_per_batch_size
        return replace(
            plain,
            mode="dynamic" if schedule else "speculative",  # [] is static, as in vLLM
            drafter=drafter,
            num_speculative_tokens=route.num_speculative_tokens,
            num_speculative_tokens_per_batch_size=schedule or None,
            per_request_spec_decode_metrics="summary",
        )
    except ValueError as exc:  # no such drafter; a k the emulator refuses
        raise ValueError(f"[routes.{name.value}] {exc}") from None


def gpu_of(config: Config, route: RouteConfig, index: int) -> str:
    """The emulated GPU of a route's index-th server: its device's ("gpu" when none is
    named), the index-th with by-index pairs."""
    device = route.device or "gpu"
    return f"{device}:{index}" if config.backends.pairs is Pairing.BY_INDEX else device


def emulators_of(
    config: Config, *, time_scale: float, gpu_profile: str, seed: int
) -> dict[Route, EmulatorConfig]:
    """Every route's server knobs, checked before anything starts: a ConfigError names
    each route the GPU profile cannot run."""
    try:
        plain = EmulatorConfig(
            mode="baseline", model=MODEL, seed=seed, time_scale=time_scale, gpu_profile=gpu_profile
        )
    except ValueError as exc:
        raise ConfigError(f"serve --emulate: {exc}") from None
    found: dict[Route, EmulatorConfig] = {}
    problems: list[str] = []
    for name, route in config.routes.items():
        try:
            found[name] = route_emulator(name, route, plain)
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError("serve --emulate: " + "; ".join(problems))
    return found


@contextlib.asynccontextmanager
async def configured_stack(
    config: Config,
    *,
    time_scale: float = 1.0,
    gpu_profile: str = DEFAULT_GPU_PROFILE,
    seed: int = 0,
    tokens: TokenCounter | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> AsyncIterator[ConfiguredStack]:
    """The config's routes on emulated servers and the gateway over them, on `host`:`port`
    (its servers on 127.0.0.1 ephemeral ports)."""
    emulators = emulators_of(config, time_scale=time_scale, gpu_profile=gpu_profile, seed=seed)
    shared: dict[str, SharedGpu] = {}
    runners: list[web.AppRunner] = []
    try:
        routes: dict[Route, RouteConfig] = {}
        gpus: dict[Route, tuple[str, ...]] = {}
        for name, route in config.routes.items():
            urls: list[str] = []
            gpus[name] = tuple(gpu_of(config, route, i) for i in range(len(route.urls)))
            for gpu in gpus[name]:
                app = create_emulator_app(emulators[name], shared.setdefault(gpu, SharedGpu()))
                runner, url = await serve_app(app)
                runners.append(runner)
                urls.append(url)
            # the emulated servers want no key: the config's would name a missing variable
            routes[name] = replace(route, urls=tuple(urls), api_key_env="")
        running = emulated_config(config, routes)
        runner, gateway = await serve_app(create_app(running, tokens=tokens), host, port)
        runners.append(runner)
        yield ConfiguredStack(gateway, running, emulators, gpus)
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


def emulated_config(config: Config, routes: dict[Route, RouteConfig]) -> Config:
    """`config` over the emulated servers, writing none of its files (NOT_WRITTEN)."""
    running = dataclasses.replace(
        config,
        routes=routes,
        outcome_log=OutcomeLogConfig(),
        record=RecordConfig(),
        routing=replace(config.routing, profile_path="", state_path=""),
    )
    check_routes(running)
    return running


async def serve_configured(
    config: Config,
    host: str,
    port: int,
    time_scale: float = 1.0,
    gpu_profile: str = DEFAULT_GPU_PROFILE,
) -> None:
    """The config's routes on EMULATED servers behind the gateway, until Ctrl-C."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with configured_stack(
        config, time_scale=time_scale, gpu_profile=gpu_profile, host=host, port=port
    ) as stack:
        print(banner(stack), flush=True)
        await stop.wait()


def banner(stack: ConfiguredStack) -> str:
    """What `serve --emulate --config` says at start: loudly EMULATED, each route's servers
    and GPU, and the files it does not write."""
    emulators = list(stack.emulators.values())
    plain = next((e for e in emulators if not e.speculative), emulators[0])  # names no drafter
    lines = [
        f"specroute gateway on {stack.gateway}/v1 in front of EMULATED vLLM servers for the "
        f"config's {len(emulators)} routes (model {MODEL!r}; no model runs; timing "
        f"from the {describe_gpu(plain)}):"
    ]
    for name, route in stack.config.routes.items():
        emulator = stack.emulators[name]
        speculation = (
            f"{route.method} k={route.num_speculative_tokens}, drafter {emulator.drafter}"
            if route.speculative
            else "no speculation"
        )
        servers = ", ".join(
            f"{url} on emulated GPU {gpu}"
            for url, gpu in zip(route.urls, stack.gpus[name], strict=True)
        )
        lines.append(f"  {name.value} ({speculation}): {servers}")
    lines.append(
        f"Not written: {', '.join(NOT_WRITTEN)}. The page: {stack.gateway}/ui. Ctrl-C stops."
    )
    return "\n".join(lines)
