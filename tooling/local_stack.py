"""Emulated vLLM servers and the gateway in one process, on free local ports.

Two servers (speculative and baseline) and a gateway by default; `routes_stack`
runs N routes (none, eagle3:3, ngram:8, ...), a server each on one emulated GPU,
with a gateway over all of them and two-route gateways beside it.

Used by `specroute demo`, `specroute serve --emulate` and the benchmarks: the
same app factories as production, run under AppRunner with handler
cancellation on, on 127.0.0.1 ephemeral ports.

`pairs=2` runs a host with two GPUs as deployed there: a pair per GPU, four
emulated servers; speculative i and baseline i share emulated GPU i (each its
own, with gpus=2), and the gateway is told which pair is which
(`backends.pairs = "by-index"`).

`with_dynamic=True` also starts the single-server alternative to the whole
stack: one emulated vLLM with dynamic speculative decoding (K per batch size,
vLLM's num_speculative_tokens_per_batch_size), on an emulated GPU of its own
and behind no gateway, so a bench can compare it with the pair and the gateway.
Same model, seed and knobs as the speculative server; the emulator does not
model GPU memory shares, so every server, the dynamic one included, has the
default KV cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
from aiohttp import web

from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.config import Config, parse_config
from tooling.emulator import EmulatorConfig, SharedGpu, create_emulator_app
from tooling.emulator.config import DEFAULT_GPU_PROFILE, drafter_method
from tooling.emulator.costs import describe_gpu, draft_cost_ratio
from tooling.emulator.dynamic import DEFAULT_SCHEDULE, Schedule, schedule_from_json

MODEL = "emulated-model"


@dataclass(frozen=True, slots=True)
class LocalStack:
    speculative: str
    baseline: str
    gateway: str
    emulator: EmulatorConfig  # the speculative one's knobs (k, c) as the gateway was told
    gpus: int  # 1: both servers share one emulated GPU (as deployed); 2: one each
    dynamic: str | None = None  # with_dynamic: one dynamic-SD server, its own GPU, no gateway
    dynamic_emulator: EmulatorConfig | None = None  # its knobs, the K schedule included
    # (speculative, baseline) URLs of each pair; pair 0's are `speculative` and `baseline`.
    pairs: tuple[tuple[str, str], ...] = ()


async def serve_app(
    app: web.Application, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Run `app` as production does (handler cancellation on); return its runner and URL."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind((host, port))
    await web.SockSite(runner, sock).start()
    return runner, f"http://{host}:{sock.getsockname()[1]}"


async def wait_healthy(url: str, timeout_s: float = 20.0) -> None:
    """Poll `url`/health until it answers 200 (a server started in another process)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"{url}/health") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{url} did not become healthy in {timeout_s:g} s")
            await asyncio.sleep(0.05)


def gateway_config(
    spec_url: str | Sequence[str],
    base_url: str | Sequence[str],
    emulator: EmulatorConfig,
    **overrides: Any,
) -> Config:
    """A gateway config for the emulated pair: k and c as the speculative emulator runs them.
    Whether the two share a GPU is not told: the gateway's profile measures it (beside).
    Several URLs per route are pairs by index (speculative i with baseline i)."""
    spec_urls = [spec_url] if isinstance(spec_url, str) else list(spec_url)
    base_urls = [base_url] if isinstance(base_url, str) else list(base_url)
    raw: dict[str, Any] = {
        "backends": {
            "speculative": {
                "urls": spec_urls,
                "num_speculative_tokens": emulator.num_speculative_tokens,
                "draft_cost_ratio": draft_cost_ratio(emulator),
            },
            "baseline": {"urls": base_urls},
            **({"pairs": "by-index"} if len(spec_urls) > 1 else {}),
        },
        "upstream": {"scrape_interval_s": 0.5, "health_interval_s": 1.0},
    }
    for section, values in overrides.items():
        raw[section] = {**raw.get(section, {}), **values}
    return parse_config(raw)


@contextlib.asynccontextmanager
async def local_stack(
    *,
    time_scale: float = 1.0,
    seed: int = 0,
    tokens: TokenCounter | None = None,
    gateway_host: str = "127.0.0.1",
    gateway_port: int = 0,
    gpus: int = 1,
    pairs: int = 1,
    with_dynamic: bool = False,
    dynamic_schedule: Schedule | None = None,
    gpu_profile: str = DEFAULT_GPU_PROFILE,
    drafter: str = "draft-1b",
    **gateway_overrides: Any,
) -> AsyncIterator[LocalStack]:
    """gpus=2 gives each server its own emulated GPU (a host with two; the cost
    model is told so), to compare with the deployment in deploy/, which is one.
    pairs=N runs N such pairs, as on a host with N GPUs (speculative i and baseline i
    share GPU i with gpus=1), the gateway told backends.pairs = "by-index".
    with_dynamic adds a dynamic-SD server (dynamic_schedule: its K per batch size,
    as vLLM's num_speculative_tokens_per_batch_size; None: the emulator's default).
    gpu_profile and drafter: the measured GPU every emulated server runs on, and the
    speculative server's drafter (tooling/emulator/gpu/)."""
    if gpus not in (1, 2):
        raise ValueError(f"local_stack: gpus is 1 or 2, not {gpus}")
    if pairs < 1:
        raise ValueError(f"local_stack: pairs must be >= 1, not {pairs}")
    if dynamic_schedule is not None and not with_dynamic:
        raise ValueError("local_stack: dynamic_schedule needs with_dynamic=True")
    spec_cfg = EmulatorConfig(
        mode="speculative",
        model=MODEL,
        seed=seed,
        time_scale=time_scale,
        per_request_spec_decode_metrics="summary",
        gpu_profile=gpu_profile,
        drafter=drafter,
    )
    base_cfg = replace(spec_cfg, mode="baseline", per_request_spec_decode_metrics="none")
    runners: list[web.AppRunner] = []
    urls: list[tuple[str, str]] = []
    try:
        for _ in range(pairs):
            shared = SharedGpu()  # both servers on one GPU, as deployed
            spec_gpu, base_gpu = (shared, shared) if gpus == 1 else (SharedGpu(), SharedGpu())
            spec_runner, spec_url = await serve_app(create_emulator_app(spec_cfg, spec_gpu))
            runners.append(spec_runner)
            base_runner, base_url = await serve_app(create_emulator_app(base_cfg, base_gpu))
            runners.append(base_runner)
            urls.append((spec_url, base_url))
        spec_urls, base_urls = [s for s, _ in urls], [b for _, b in urls]
        config = gateway_config(spec_urls, base_urls, spec_cfg, **gateway_overrides)
        gw_runner, gw_url = await serve_app(
            create_app(config, tokens=tokens), gateway_host, gateway_port
        )
        runners.append(gw_runner)
        dyn_url, dyn_cfg = None, None
        if with_dynamic:
            dyn_cfg = replace(
                spec_cfg, mode="dynamic", num_speculative_tokens_per_batch_size=dynamic_schedule
            )
            dyn_runner, dyn_url = await serve_app(create_emulator_app(dyn_cfg, SharedGpu()))
            runners.append(dyn_runner)
        spec_url, base_url = urls[0]
        yield LocalStack(
            spec_url, base_url, gw_url, spec_cfg, gpus, dyn_url, dyn_cfg, pairs=tuple(urls)
        )
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


@dataclass(frozen=True, slots=True)
class EmulatedRoute:
    """One route of an emulated N-route stack: `none`, or DRAFTER:K (eagle3:3 is route
    "eagle3-k3": an EAGLE-3 head proposing 3 tokens a step), or a dynamic-speculation
    server DRAFTER:K@SCHEDULE, SCHEDULE vLLM's num_speculative_tokens_per_batch_size in
    JSON or `dynamic` (the emulator's default, its K at most K): route "eagle3-k4-dynamic"."""

    drafter: str | None  # None: no speculation
    k: int = 0
    schedule: Schedule = ()  # a dynamic server's K per batch size; (): static k

    @property
    def name(self) -> str:
        if self.drafter is None:
            return "none"
        return f"{self.drafter}-k{self.k}" + ("-dynamic" if self.schedule else "")

    @classmethod
    def parse(cls, text: str) -> EmulatedRoute:
        text = text.strip()
        if text == "none":
            return cls(None)
        static, at, schedule = text.partition("@")
        drafter, sep, k = static.rpartition(":")
        if not drafter or not sep or not k.isdigit() or int(k) < 1:
            raise ValueError(
                f"--routes: {text!r}: want none or DRAFTER:K (a dynamic server: "
                "DRAFTER:K@SCHEDULE), DRAFTER one the GPU profile measured and K >= 1 "
                "(e.g. eagle3:3, eagle3:4@dynamic, eagle3:4@[[1,8,4],[9,256,1]])"
            )
        if not at:
            return cls(drafter, int(k))
        if schedule == "dynamic":
            return cls(
                drafter, int(k), tuple((a, b, min(v, int(k))) for a, b, v in DEFAULT_SCHEDULE)
            )
        try:
            parsed = schedule_from_json(schedule)
        except ValueError as exc:
            raise ValueError(f"--routes: {text!r}: {exc}") from None
        if not parsed or max(e[2] for e in parsed) > int(k):
            raise ValueError(f"--routes: {text!r}: want a schedule with its K at most {k}")
        return cls(drafter, int(k), parsed)

    def emulator(self, plain: EmulatorConfig) -> EmulatorConfig:
        if self.drafter is None:
            return plain
        return replace(
            plain,
            mode="dynamic" if self.schedule else "speculative",
            drafter=self.drafter,  # checked by EmulatorConfig against the GPU profile
            num_speculative_tokens=self.k,
            num_speculative_tokens_per_batch_size=self.schedule or None,
            per_request_spec_decode_metrics="summary",
        )

    def table(self, url: str, emulator: EmulatorConfig) -> dict[str, Any]:
        """Its [routes.NAME] table: method, k and c as its emulated server runs them."""
        if self.drafter is None:
            return {"urls": [url], "method": "none"}
        return {
            "urls": [url],
            "method": drafter_method(emulator),
            "num_speculative_tokens": self.k,
            "num_speculative_tokens_per_batch_size": [list(e) for e in self.schedule],
            "draft_cost_ratio": draft_cost_ratio(emulator),
        }


@dataclass(frozen=True, slots=True)
class RoutesStack:
    """N emulated servers on one emulated GPU and the gateways over them."""

    servers: dict[str, str]  # route name -> its server's URL, in the routes' order
    gateways: dict[str, str]  # "gateway" (all routes), "gateway-2:NAME" (plain + NAME),
    # "gateway-2:A+B" (routes A and B)
    emulators: dict[str, EmulatorConfig]  # route name -> its server's knobs


def routes_config(
    routes: Sequence[EmulatedRoute],
    servers: Mapping[str, str],
    emulators: Mapping[str, EmulatorConfig],
) -> Config:
    """A gateway over these routes ([routes.NAME] tables in this order)."""
    raw: dict[str, Any] = {
        "routes": {r.name: r.table(servers[r.name], emulators[r.name]) for r in routes},
        "upstream": {"scrape_interval_s": 0.5, "health_interval_s": 1.0},
    }
    return parse_config(raw)


def pair_members(pair: str, plain: str) -> tuple[str, str]:
    """A two-route gateway's routes: "NAME" is the plain route and NAME, "A+B" A and B."""
    first, sep, second = pair.partition("+")
    return (first, second) if sep else (plain, pair)


@contextlib.asynccontextmanager
async def routes_stack(
    routes: Sequence[EmulatedRoute],
    *,
    time_scale: float = 1.0,
    seed: int = 0,
    gpu_profile: str = DEFAULT_GPU_PROFILE,
    pairs_with: Sequence[str] | None = None,
    ready: Callable[[str], Awaitable[None]] | None = None,
) -> AsyncIterator[RoutesStack]:
    """A server per route, all on ONE emulated GPU (as deployed on one), a gateway over
    all of them ("gateway") and a two-route gateway per item of `pairs_with`
    ("gateway-2:NAME" over the plain route and NAME, "gateway-2:A+B" over A and B; None:
    the plain route with each speculative one). The gateways
    start one after the other, each once `ready(url)` returns (the bench waits there for
    its start-up profile, so no two profiles' probes share the GPU)."""
    names = [r.name for r in routes]
    if len(set(names)) != len(names) or len(routes) < 2:
        raise ValueError(f"routes_stack: want two distinct routes or more, got {names}")
    plain = next((r for r in routes if r.drafter is None), None)
    if plain is None:
        raise ValueError("routes_stack: one route must be none (the plain server)")
    pairs_with = [r.name for r in routes if r.drafter] if pairs_with is None else pairs_with
    pairs = {p: pair_members(p, plain.name) for p in pairs_with}
    unknown = [p for p, (a, b) in pairs.items() if a == b or not {a, b} <= set(names)]
    if unknown:
        raise ValueError(f"routes_stack: no two routes {', '.join(unknown)} to pair")
    base = EmulatorConfig(
        mode="baseline", model=MODEL, seed=seed, time_scale=time_scale, gpu_profile=gpu_profile
    )
    emulators = {r.name: r.emulator(base) for r in routes}
    gpu = SharedGpu()
    runners: list[web.AppRunner] = []
    try:
        servers: dict[str, str] = {}
        for r in routes:
            runner, servers[r.name] = await serve_app(create_emulator_app(emulators[r.name], gpu))
            runners.append(runner)
        by_name = {r.name: r for r in routes}
        gateways: dict[str, list[EmulatedRoute]] = {"gateway": list(routes)}
        gateways |= {f"gateway-2:{p}": [by_name[a], by_name[b]] for p, (a, b) in pairs.items()}
        urls: dict[str, str] = {}
        for label, members in gateways.items():
            config = routes_config(members, servers, emulators)
            runner, urls[label] = await serve_app(create_app(config))
            runners.append(runner)
            if ready is not None:
                await ready(urls[label])
        yield RoutesStack(servers, urls, emulators)
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


async def serve_emulated(
    host: str,
    port: int,
    time_scale: float,
    gpu_profile: str = DEFAULT_GPU_PROFILE,
    drafter: str = "",
) -> None:
    """A gateway with two EMULATED backends, until Ctrl-C: for trying the SDK by hand.
    gpu_profile: a shipped name or a profile file; drafter "": the profile's first."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with local_stack(
        time_scale=time_scale,
        gateway_host=host,
        gateway_port=port,
        gpu_profile=gpu_profile,
        drafter=drafter,
    ) as stack:
        print(
            f"specroute gateway on {stack.gateway}/v1 in front of two EMULATED vLLM servers "
            f"(speculative {stack.speculative}, baseline {stack.baseline}; model {MODEL!r}; "
            f"no model runs; timing from the {describe_gpu(stack.emulator)}). Ctrl-C stops.",
            flush=True,
        )
        await stop.wait()
