"""The chaos run of issue 16: "Never fail a request the other backend could serve,
and never let one client slow the gateway for everyone."

Shared by tests/gateway/test_chaos.py (one short run, asserted) and
benchmarks/soak.py (long runs). Two EMULATED vLLM servers run as processes, so
a kill is a SIGKILL and a refused connection a real one; the gateway runs in
the caller's process as production runs it (tooling.local_stack.serve_app).

- EmulatedBackend: one server process, killed and restarted on the same port.
- Watch: the run's own view of each backend (/health every 50 ms, and its
  engine's running and waiting counts), to judge every failure by whether a
  backend was up at that moment, and every wait by whether the other server
  had room.
- Chaos: the scripted events (kill and restart, stall, eject one then kill
  the other, saturate a queue, flood the gateway with 4 MB bodies), each
  starting once the gateway uses both backends, each written to a Timeline.
- send, run_load, run_probes: every request bounded in time, each one's
  ending kept as a Sent; summarize turns them into the figures to quote.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import json
import math
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
from aiohttp import web

from classifier.types import PAIR, Route
from gateway.config import Config, parse_config
from gateway.request.dispatch import FAILOVER_HEADER, REASON_HEADER, ROUTE_HEADER
from gateway.state import BACKENDS
from gateway.wire.proxy import has_token
from tooling.local_stack import wait_healthy
from tooling.workloads import build

MODEL = "emulated-model"
ROOT = Path(__file__).resolve().parents[1]
CHAT = "/v1/chat/completions"
JSON = {"Content-Type": "application/json"}
# The emulator's costs as the gateway is told them (EmulatorConfig's defaults).
SPEC_K, SPEC_DRAFT_COST = 4, 0.2


def _other(route: Route) -> Route:
    """The pair's other route."""
    return Route.BASELINE if route == Route.SPECULATIVE else Route.SPECULATIVE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmulatedBackend:
    """One emulated vLLM server in its own process: SIGKILL, then a restart on the same port."""

    def __init__(
        self, route: Route, *, time_scale: float, max_num_seqs: int, seed: int = 0
    ) -> None:
        self.route = route
        self.max_num_seqs = max_num_seqs
        self.url = f"http://127.0.0.1:{free_port()}"
        self._args = [
            sys.executable,
            *("-m", "gateway.cli", "emulate", "--mode", route.value, "--model", MODEL),
            *("--port", self.url.rsplit(":", 1)[1], "--seed", str(seed)),
            *("--time-scale", str(time_scale), "--max-num-seqs", str(max_num_seqs)),
        ]
        if route == Route.SPECULATIVE:
            self._args += ["--per-request-spec-decode-metrics", "summary"]
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            self._args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()

    async def ready(self) -> None:
        await wait_healthy(self.url)

    async def faults(self, session: aiohttp.ClientSession, faults: dict[str, Any] | None) -> None:
        """Set the emulator's runtime faults (None: clear them)."""
        url = f"{self.url}/emulator/faults"
        request = session.post(url, json=faults) if faults else session.delete(url)
        async with request as resp:
            resp.raise_for_status()


def gateway_config(backends: dict[Route, EmulatedBackend], **upstream: float | int) -> Config:
    """The gateway in front of the two processes, as deployed (cost model), with bodies up
    to 8 MiB accepted (the flood sends 4 MB ones) and each backend's admission limit at its
    engine's max_num_seqs, as config.toml asks an operator to set it. Each process is an
    emulated GPU of its own (neither slows the other), so each route names its own device:
    told they share one, the gateway would consolidate the batch on one server, and the
    other's free slots would be the wrong belief's, not a routing choice."""
    spec, base = backends[Route.SPECULATIVE], backends[Route.BASELINE]
    return parse_config(
        {
            "routes": {
                "speculative": {
                    "urls": [spec.url],
                    "method": "draft_model",
                    "num_speculative_tokens": SPEC_K,
                    "draft_cost_ratio": SPEC_DRAFT_COST,
                    "max_inflight": spec.max_num_seqs,
                    "device": "emulated-gpu-speculative",
                },
                "baseline": {
                    "urls": [base.url],
                    "max_inflight": base.max_num_seqs,
                    "device": "emulated-gpu-baseline",
                },
            },
            "server": {"max_body_bytes": 8 * 1024 * 1024},
            "upstream": upstream,
        }
    )


def gateway_rotation(app: web.Application) -> Callable[[Route], bool]:
    """Whether the gateway sends new requests to `route` now (healthy and not ejected)."""
    return lambda route: app[BACKENDS].of(route).healthy


class Seen(NamedTuple):
    """One poll of one backend: /health, and its engine's running and waiting counts."""

    healthy: bool
    running: int | None
    waiting: int | None


class Watch:
    """The run's own view of each backend, independent of the gateway's: /health, and
    whether its engine has a free slot and nobody waiting (the emulator's admin state)."""

    def __init__(self, backends: Iterable[EmulatedBackend], interval_s: float = 0.05) -> None:
        self._backends = list(backends)
        self._interval_s = interval_s
        self._times: dict[Route, list[float]] = {b.route: [] for b in self._backends}
        self._seen: dict[Route, list[Seen]] = {b.route: [] for b in self._backends}

    async def run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as session:
            while True:
                await asyncio.gather(*(self._poll(session, b) for b in self._backends))
                await asyncio.sleep(self._interval_s)

    async def _poll(self, session: aiohttp.ClientSession, backend: EmulatedBackend) -> None:
        healthy, running, waiting = False, None, None
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError, KeyError):
            async with session.get(f"{backend.url}/health") as resp:
                healthy = resp.status == 200
            async with session.get(f"{backend.url}/emulator/state") as resp:
                state = await resp.json()
            running, waiting = int(state["running"]), int(state["waiting"])
        self._times[backend.route].append(time.monotonic())
        self._seen[backend.route].append(Seen(healthy, running, waiting))

    def _at(self, backend: EmulatedBackend, t: float) -> Seen:
        i = bisect.bisect_right(self._times[backend.route], t) - 1
        return self._seen[backend.route][i] if i >= 0 else Seen(False, None, None)

    def any_healthy_at(self, t: float) -> bool:
        return any(self._at(b, t).healthy for b in self._backends)

    def room_at(self, route: Route, t: float) -> bool:
        """`route` answered /health and had a free slot and no queue at `t`."""
        backend = next(b for b in self._backends if b.route == route)
        seen = self._at(backend, t)
        return seen.healthy and seen.waiting == 0 and (seen.running or 0) < backend.max_num_seqs

    def engines_at(self, t: float) -> str:
        seen = {b.route.value: self._at(b, t) for b in self._backends}
        return "; ".join(f"{r} {s.running} running, {s.waiting} waiting" for r, s in seen.items())


@dataclass(slots=True)
class Event:
    name: str  # kill, stall, eject, saturate, flood
    route: Route | None  # the backend it hit (the flood hits the gateway)
    started: float
    ended: float = math.inf
    note: str = ""
    # When all its requests were in (a saturation: the last stream's answer headers, so
    # the gateway had counted it); until then a request sent beside them raced them.
    filled: float | None = None


@dataclass
class Timeline:
    t0: float = field(default_factory=time.monotonic)
    events: list[Event] = field(default_factory=list)

    def begin(self, name: str, route: Route | None) -> Event:
        event = Event(name, route, time.monotonic())
        self.events.append(event)
        return event

    def hit(self, name: str, route: Route, start: float, end: float) -> bool:
        """An event `name` on `route` overlapped [start, end]."""
        return any(
            e.name == name and e.route == route and e.started <= end and start <= e.ended
            for e in self.events
        )

    def arrived(self, name: str, route: Route, start: float, end: float) -> bool:
        """An event `name` on `route` arrived within (start, end]: it began by `end` and
        was not all in yet at `start` (its start, where it has no fill time)."""
        return any(
            e.name == name
            and e.route == route
            and e.started <= end
            and start < (e.started if e.filled is None else e.filled)
            for e in self.events
        )

    def during(self, name: str, t: float) -> bool:
        return any(e.name == name and e.started <= t <= e.ended for e in self.events)

    def describe(self) -> str:
        return ", ".join(
            f"{e.name} {e.route.value if e.route else 'gateway'} at {e.started - self.t0:.1f} s"
            + (f" ({e.note})" if e.note else "")
            for e in self.events
        )


@dataclass(frozen=True, slots=True)
class Sent:
    """One request as its client saw it."""

    kind: str  # load | probe | greedy
    stream: bool
    started: float
    ended: float
    status: int
    route: Route | None  # x-specroute-route: the backend that answered
    ttft_s: float | None
    # done | error+done (streams), json (whole answers), left (the client left on
    # purpose), else what was wrong: a status, an exception, a stream without [DONE].
    ending: str
    detail: str = ""
    failover_from: str | None = None  # x-specroute-failover: the backend tried first
    reason: str | None = None  # x-specroute-reason: why the gateway chose that route
    # A probe's twin: the same prompt sent once its route was known, named to the other
    # server (x-specroute-route), its time to first token: what the other choice gave.
    twin_ttft_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.ending in ("done", "json")

    @property
    def bad_stream(self) -> bool:
        return self.ending.startswith("bad stream")

    def what(self) -> str:
        """Its shape and ending, without times: failures alike read as one line."""
        route = self.route.value if self.route else "-"
        moved = f" (failed over from {self.failover_from})" if self.failover_from else ""
        try:
            error = json.loads(self.detail)["error"]
            why = f" {error['code']} ({error['message']})"
        except (ValueError, KeyError, TypeError):
            why = f" {self.detail[:80]}" if self.detail else ""
        shape = "stream" if self.stream else "whole"
        return f"{self.kind} {shape} via {route}{moved}: {self.ending}{why}"


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    *,
    kind: str,
    stream: bool,
    headers: dict[str, str] | None = None,
    timeout_s: float = 30.0,
    leave_after: int = 0,
    on_route: Callable[[Route | None], object] | None = None,
) -> Sent:
    """POST one request and read all of it (a stream: up to `leave_after` events, if set);
    `on_route` is told the route that answers as soon as its headers say it."""
    started = time.monotonic()
    status, route, ttft, ending, detail = 0, None, None, "no answer", ""
    moved = reason = None
    try:
        async with (
            asyncio.timeout(timeout_s),
            session.post(url, data=body, headers={**JSON, **(headers or {})}) as resp,
        ):
            status = resp.status
            route = _route(resp.headers.get(ROUTE_HEADER))
            moved = resp.headers.get(FAILOVER_HEADER)
            reason = resp.headers.get(REASON_HEADER)
            if on_route is not None:
                on_route(route)
            if status != 200:
                ending = f"status {status}"
                detail = (await resp.read())[:200].decode(errors="replace")
            elif not stream:
                answer = await resp.json()
                ending = "json" if answer.get("choices") else "no choices"
            else:
                ending, ttft = await _read_stream(resp, started, leave_after)
    except TimeoutError:
        ending = f"timeout after {timeout_s:g} s"
    except (aiohttp.ClientError, ValueError) as exc:
        ending = f"bad stream: {type(exc).__name__}" if stream else type(exc).__name__
        detail = str(exc)
    ended = time.monotonic()
    return Sent(kind, stream, started, ended, status, route, ttft, ending, detail, moved, reason)


def _route(value: str | None) -> Route | None:
    return Route(value) if value in ("speculative", "baseline") else None


async def _read_stream(
    resp: aiohttp.ClientResponse, started: float, leave_after: int
) -> tuple[str, float | None]:
    kinds: list[str] = []
    ttft = None
    events = 0
    async for line in resp.content:
        if line.startswith(b"data: [DONE]"):
            kinds.append("done")
        elif line.startswith(b'data: {"error"'):
            kinds.append("error")
        elif line.startswith(b"data: "):
            kinds.append("event")
            events += 1
            if ttft is None and has_token(json.loads(line[6:])):
                ttft = time.monotonic() - started
            if events == leave_after:
                return "left", ttft  # leaving the block closes the connection mid-stream
    return _stream_ending(kinds), ttft


def _stream_ending(kinds: list[str]) -> str:
    """Every stream ends with [DONE], after the events or after one error event."""
    if not kinds or kinds[-1] != "done" or kinds.count("done") > 1:
        return "bad stream: no single [DONE] at its end"
    errors = kinds.count("error")
    if errors == 0:
        return "done"
    if errors == 1 and kinds[-2] == "error":
        return "error+done"
    return "bad stream: an error event not followed by [DONE]"


@dataclass(frozen=True, slots=True)
class Load:
    """Closed-loop clients: mixed streams and whole answers, some naming a route."""

    concurrency: int
    stream_share: float = 0.5
    leave_share: float = 0.0  # streams the client leaves after 3 events (soak)
    max_tokens: int = 64
    timeout_s: float = 30.0
    seed: int = 0
    ramp_s: float = 1.0  # clients start one after the other over this time, not all at once

    def override(self, client: int) -> dict[str, str]:
        """Clients 1 and 5 of every 8 name a route (x-specroute-route), the rest do not."""
        route = {1: "speculative", 5: "baseline"}.get(client % 8)
        return {ROUTE_HEADER: route} if route else {}


def load_bodies(load: Load) -> list[tuple[bytes, bytes]]:
    """(whole, streamed) bodies of short-prompt workloads: a queue wait, not a long
    prefill, is what the probes' time to first token should show."""
    requests = build(["structured", "sql", "creative", "chat"], 50, model=MODEL, seed=load.seed)
    out = []
    for r in requests:
        body = {**r.body, "max_tokens": min(int(r.body.get("max_tokens", 64)), load.max_tokens)}
        out.append((json.dumps(body).encode(), json.dumps({**body, "stream": True}).encode()))
    return out


async def run_load(
    session: aiohttp.ClientSession,
    gateway: str,
    load: Load,
    running: Callable[[], bool],
    sent: list[Sent],
) -> None:
    """The closed-loop clients, each sending again while `running()` says so."""
    bodies = load_bodies(load)
    counter = itertools.count()

    async def client(i: int) -> None:
        rng = random.Random(f"{load.seed}:client:{i}")
        await asyncio.sleep(load.ramp_s * i / load.concurrency)
        while running():
            whole, streamed = bodies[next(counter) % len(bodies)]
            stream = rng.random() < load.stream_share
            leave = 3 if stream and rng.random() < load.leave_share else 0
            sent.append(
                await send(
                    session,
                    gateway + CHAT,
                    streamed if stream else whole,
                    kind="load",
                    stream=stream,
                    headers=load.override(i),
                    timeout_s=load.timeout_s,
                    leave_after=leave,
                )
            )

    await asyncio.gather(*(client(i) for i in range(load.concurrency)))


# The probe: a prompt long enough that its prefill, not where a step boundary
# fell, is most of its time to first token; 8 tokens out. Each probe's text differs.
_PROBE_TEXT = " ".join(
    random.Random(16).choices(["order", "latency", "river", "report", "cache", "story"], k=1500)
)


def probe_body(i: int) -> bytes:
    content = f"Probe {i}. Summarise in one line: {_PROBE_TEXT}"
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    return json.dumps({**body, "max_tokens": 8, "temperature": 0.7, "stream": True}).encode()


async def unloaded_ttft(session: aiohttp.ClientSession, gateway: str, repeats: int = 3) -> float:
    """The probe's time to first token on an idle stack: per route (named with the
    override header), the median of `repeats`; the faster route's."""
    medians = []
    for n, route in enumerate(PAIR):
        ttfts = []
        for i in range(repeats):
            s = await send(
                session,
                gateway + CHAT,
                probe_body(-1 - n * repeats - i),
                kind="unloaded",
                stream=True,
                headers={ROUTE_HEADER: route.value},
            )
            if s.ttft_s is None:
                raise AssertionError(f"unloaded probe failed: {s.what()}")
            ttfts.append(s.ttft_s)
        medians.append(statistics.median(ttfts))
    return min(medians)


async def run_probes(
    session: aiohttp.ClientSession,
    gateway: str,
    running: Callable[[], bool],
    every_s: float,
    sent: list[Sent],
) -> None:
    """A probe every `every_s`, each on its own: one parked in a queue does not hold back
    the next. As soon as a probe's route is known, its twin (the same prompt) is sent to
    the other server: the wait the other choice gave at that moment, on the same
    machine's CPU. The twin is not a request of the run (only its first token is kept)."""

    async def probe(i: int) -> None:
        twins: list[asyncio.Task[Sent]] = []

        def twin(route: Route | None) -> None:
            if route is not None:
                other = {ROUTE_HEADER: _other(route).value}
                twins.append(
                    asyncio.create_task(
                        send(session, gateway + CHAT, body, kind="twin", stream=True, headers=other)
                    )
                )

        body = probe_body(i)
        s = await send(session, gateway + CHAT, body, kind="probe", stream=True, on_route=twin)
        for done in await asyncio.gather(*twins):
            if s.route is not None and done.ok and done.route == _other(s.route):
                s = replace(s, twin_ttft_s=done.ttft_s)
        sent.append(s)

    async with asyncio.TaskGroup() as tg:
        for i in itertools.count():
            if not running():
                break
            tg.create_task(probe(i))
            await asyncio.sleep(every_s)


Action = Callable[[], Awaitable[None]]


async def wait_until(condition: Callable[[], bool], what: str, *, timeout_s: float) -> None:
    """Poll `condition` every 10 ms until it holds; AssertionError naming `what` past
    `timeout_s` (a scripted event that did not happen as scripted)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(0.01)


async def run_schedule(start: float, steps: Sequence[tuple[float, Action]]) -> None:
    """Each action at its time after `start`, one after the other (a late one runs at once)."""
    for at_s, action in steps:
        await asyncio.sleep(max(0.0, start + at_s - time.monotonic()))
        await action()


class Chaos:
    """The scripted events; each one is written to the timeline as it happens."""

    def __init__(
        self,
        backends: dict[Route, EmulatedBackend],
        timeline: Timeline,
        session: aiohttp.ClientSession,
        in_rotation: Callable[[Route], bool],
        gateway: str,
        sent: list[Sent],
    ) -> None:
        self.backends = backends
        self.timeline = timeline
        self._session = session
        self._in_rotation = in_rotation
        self._gateway = gateway
        self._sent = sent

    async def steady(self, timeout_s: float = 15.0) -> None:
        """Every event starts from the same place: the gateway uses both backends."""
        await wait_until(
            lambda: all(self._in_rotation(route) for route in self.backends),
            "the gateway to use both backends",
            timeout_s=timeout_s,
        )

    async def kill_restart(self, route: Route, down_s: float) -> None:
        """SIGKILL the server, restart it on the same port `down_s` later, wait for /health."""
        await self.steady()
        await self._kill_restart(route, down_s)

    async def _kill_restart(self, route: Route, down_s: float) -> None:
        event = self.timeline.begin("kill", route)
        backend = self.backends[route]
        backend.kill()
        await asyncio.sleep(down_s)
        backend.start()
        await backend.ready()
        event.ended = time.monotonic()

    async def stall(self, route: Route, *, stall_s: float, requests: int, hold_s: float) -> None:
        """The next `requests` answers go silent for stall_s after two chunks (a whole
        answer: once it is ready); cleared after hold_s."""
        await self.steady()
        event = self.timeline.begin("stall", route)
        backend = self.backends[route]
        fault = {"stall_s": stall_s, "stall_after_chunks": 2, "fault_limit": requests}
        await backend.faults(self._session, fault)
        await asyncio.sleep(hold_s)
        await backend.faults(self._session, None)
        event.ended = time.monotonic() + stall_s  # a stall begun just before lasts that long
        event.note = f"{requests} answers silent {stall_s:g} s"

    async def eject_then_kill(self, route: Route, *, down_s: float, timeout_s: float = 5.0) -> None:
        """`route` answers 500 until the gateway ejects it, then recovers (still ejected),
        and the other server is killed: the ejected one is all there is."""
        await self.steady()
        event = self.timeline.begin("eject", route)
        backend = self.backends[route]
        await backend.faults(self._session, {"fail_status": 500})
        try:
            await wait_until(
                lambda: not self._in_rotation(route),
                f"the gateway to eject {route.value}",
                timeout_s=timeout_s,
            )
            event.note = f"ejected after {time.monotonic() - event.started:.2f} s of 500s"
        except AssertionError as exc:
            event.note = f"NOT as scripted: {exc}"
        finally:
            await backend.faults(self._session, None)
            event.ended = time.monotonic()
        await self._kill_restart(_other(route), down_s)

    async def saturate(self, route: Route, *, hold_s: float) -> None:
        """As many streams as `route` has slots, named to it and never read, for hold_s: its
        engine is full and anything else sent there waits in its queue."""
        await self.steady()
        event = self.timeline.begin("saturate", route)
        backend = self.backends[route]
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell me a story that never ends."}],
            "max_tokens": 4000,
            "ignore_eos": True,
            "stream": True,
        }
        raw = json.dumps(body).encode()
        headers = {**JSON, ROUTE_HEADER: route.value}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=None)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as greedy:

            async def open_one() -> aiohttp.ClientResponse | Sent:
                started = time.monotonic()
                try:
                    async with asyncio.timeout(10.0):
                        resp = await greedy.post(self._gateway + CHAT, data=raw, headers=headers)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    ended, why = time.monotonic(), type(exc).__name__
                    return Sent("greedy", True, started, ended, 0, None, None, why, str(exc))
                if resp.status != 200:
                    detail = (await resp.read())[:200].decode(errors="replace")
                    resp.release()
                    ended, status = time.monotonic(), resp.status
                    why = f"status {status}"
                    return Sent("greedy", True, started, ended, status, None, None, why, detail)
                return resp

            opened = await asyncio.gather(*(open_one() for _ in range(backend.max_num_seqs)))
            event.filled = time.monotonic()
            await asyncio.sleep(hold_s)
            now = time.monotonic()
            for item in opened:
                if isinstance(item, Sent):
                    self._sent.append(item)
                else:
                    item.close()
                    self._sent.append(
                        Sent("greedy", True, event.started, now, 200, route, None, "left")
                    )
        event.ended = time.monotonic()
        event.note = f"{backend.max_num_seqs} streams never read for {hold_s:g} s"

    async def flood(self, seconds: float, bodies: Sequence[bytes]) -> Flood:
        """Post 4 MB bodies for `seconds` while /health is timed."""
        event = self.timeline.begin("flood", None)
        flooded = await flood(self._gateway, seconds, bodies)
        event.ended = time.monotonic()
        event.note = f"{len(bodies)} senders, /health p99 {flooded.p99_ms:.1f} ms"
        return flooded


# A queue multiplies a probe's first token; a step boundary or a bigger batch moves it by
# tens of per cent (see tests/gateway/test_chaos.py).
WAIT_BOUND = 2.0


@dataclass(frozen=True, slots=True)
class Wait:
    """A probe's time to first token over its unloaded time, and the engines it met."""

    ratio: float
    probe: Sent
    engines: str  # both engines' running and waiting counts when it was sent
    twin_ratio: float | None  # its twin's on the other server (None: no twin answered)

    def describe(self, t0: float) -> str:
        route = self.probe.route.value if self.probe.route else "-"
        twin = "no twin" if self.twin_ratio is None else f"its twin there {self.twin_ratio:.2f}"
        return (
            f"{self.ratio:.2f} (via {route}, {self.probe.reason}, sent at "
            f"{self.probe.started - t0:.1f} s when {self.engines}; {twin})"
        )

    def the_choices(self, bound: float) -> bool:
        """Over `bound` x its unloaded time where the other server gave under 1/bound of
        its wait (or no twin answered): the choice's wait. Where the twin waited as
        long, the machine's CPU slowed both servers alike and no choice was faster."""
        return self.ratio > bound and (
            self.twin_ratio is None or self.ratio > bound * self.twin_ratio
        )


@dataclass(frozen=True, slots=True)
class Figures:
    """What the run shows, request by request judged as issue 16 asks."""

    requests: int
    verdicts: Counter[str]
    failed_with_healthy: list[Sent]
    failed_without_healthy: list[Sent]
    bad_streams: list[Sent]
    unloaded_ttft_s: float
    counted_probes: int  # probes whose wait counts (see _wait_counts)
    saturation_probes: int  # of those, sent while a queue was saturated on purpose
    saturation_sent: int  # probes sent during it, counted or not
    worst_in_saturation: Wait | None
    worst_outside_saturation: Wait | None
    ttft_p50_s: float | None  # all streams' time to first token, for scale
    waits: tuple[Wait, ...]  # every counted probe's

    def over(self, bound: float) -> list[Wait]:
        """The counted probes whose wait over `bound` was the choice's (Wait.the_choices)."""
        return [w for w in self.waits if w.the_choices(bound)]

    @property
    def worst_wait(self) -> Wait | None:
        waits = [w for w in (self.worst_in_saturation, self.worst_outside_saturation) if w]
        return max(waits, key=lambda w: w.ratio, default=None)


def verdict(s: Sent, timeline: Timeline) -> str:
    if s.ok:
        return "ok"
    if s.ending == "left":
        return "left on purpose"
    if (
        s.ending == "error+done"
        and s.route is not None
        and timeline.hit("kill", s.route, s.started, s.ended)
    ):
        return "broken by a kill"  # bytes were sent when its backend died: no retry possible
    return "failed"


def summarize(sent: list[Sent], timeline: Timeline, watch: Watch, unloaded_s: float) -> Figures:
    verdicts: Counter[str] = Counter()
    with_healthy: list[Sent] = []
    without: list[Sent] = []
    for s in sent:
        v = verdict(s, timeline)
        verdicts[v] += 1
        if v == "failed":
            (with_healthy if watch.any_healthy_at(s.ended) else without).append(s)
    counted = [s for s in sent if _wait_counts(s, timeline, watch)]
    saturated = [s for s in counted if timeline.during("saturate", s.started)]
    ttfts = [s.ttft_s for s in sent if s.ttft_s is not None]
    return Figures(
        requests=len(sent),
        verdicts=verdicts,
        failed_with_healthy=with_healthy,
        failed_without_healthy=without,
        bad_streams=[s for s in sent if s.bad_stream],
        unloaded_ttft_s=unloaded_s,
        counted_probes=len(counted),
        saturation_probes=len(saturated),
        saturation_sent=sum(
            s.kind == "probe" and timeline.during("saturate", s.started) for s in sent
        ),
        worst_in_saturation=_worst(saturated, unloaded_s, watch),
        worst_outside_saturation=_worst(
            [s for s in counted if s not in saturated], unloaded_s, watch
        ),
        ttft_p50_s=statistics.median(ttfts) if ttfts else None,
        waits=tuple(_wait(s, unloaded_s, watch) for s in counted if s.ttft_s is not None),
    )


def _worst(probes: list[Sent], unloaded_s: float, watch: Watch) -> Wait | None:
    timed = [s for s in probes if s.ttft_s is not None]
    if not timed:
        return None
    return _wait(max(timed, key=lambda s: s.ttft_s or 0.0), unloaded_s, watch)


def _wait(s: Sent, unloaded_s: float, watch: Watch) -> Wait:
    twin = None if s.twin_ttft_s is None else s.twin_ttft_s / unloaded_s
    return Wait((s.ttft_s or 0.0) / unloaded_s, s, watch.engines_at(s.started), twin)


def _wait_counts(s: Sent, timeline: Timeline, watch: Watch) -> bool:
    """A probe that answered, sent while the server that did not answer it had room (it
    could have started at once there) and the gateway held that server healthy, and not
    stalled on purpose. An `unhealthy-fallback` probe went where it went because the
    gateway held the other server down: a restarted server answers /health before the
    gateway's next probe readmits it, and a probe sent then met the one server carrying
    everything (on the emulator's measured H200, 40 running and a prefill wave: 6-7x a
    50 ms first token, whichever router). Nor a probe its server's saturation overtook:
    sent before the saturation's 40 streams were all in, it was still waiting for its
    first token when they arrived beside it, where no router could have known (on a
    busy 2-core run, 2.08x, sent at the saturation's start; and 2.53x, sent 0.1 s into
    it while the streams were still being opened, the baseline's engine at 15 running).
    Nor a probe the gateway moved off its
    choice (x-specroute-failover): its first choice was at the gateway's admission limit
    (max_inflight, the engine's max_num_seqs here: the saturation holds every slot of
    it through the gateway, while the engines' own count can read one below) or failed,
    so the server that answered was the one that could."""
    return (
        s.kind == "probe"
        and s.ok
        and s.route is not None
        and s.reason != "unhealthy-fallback"
        and s.failover_from is None
        and watch.room_at(_other(s.route), s.started)
        and not timeline.hit("stall", s.route, s.started, s.ended)
        and not timeline.arrived("saturate", s.route, s.started, first_token(s))
    )


def first_token(s: Sent) -> float:
    """When its first token came (its end where none did)."""
    return s.started + (s.ttft_s if s.ttft_s is not None else s.ended - s.started)


@dataclass(frozen=True, slots=True)
class Flood:
    """/health round trips (ms) while senders posted 4 MB bodies, and before, idle."""

    health_ms: list[float]
    idle_health_ms: list[float]
    body_bytes: int
    relayed: Counter[int]  # statuses of the answers a backend gave (x-specroute-route set)
    own: Counter[int]  # statuses the gateway answered itself (0: no answer)

    @property
    def p99_ms(self) -> float:
        return p99(self.health_ms)


def p99(values: list[float]) -> float:
    return percentile(values, 0.99)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile (NaN for no values)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def flood_body(seed: int, messages: int = 1000, chars: int = 4000) -> bytes:
    """~4 MB: `messages` distinct messages of about `chars` characters each."""
    rng = random.Random(f"flood:{seed}")
    words = ["alpha", "bravo", "cargo", "delta", "ember", "fjord", "gamma", "harbor", "ivory"]
    text = " ".join(rng.choices(words, k=3 * chars // 5))
    span = len(text) - chars
    contents = [f"{seed}-{i} {text[i * 37 % span :][:chars]}" for i in range(messages)]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": c} for c in contents],
        "max_tokens": 8,
    }
    return json.dumps(body).encode()


async def flood(gateway: str, seconds: float, bodies: Sequence[bytes]) -> Flood:
    """One sender per body posts it again and again for `seconds` while /health is timed
    every 10 ms, and for half a second before, idle.

    Senders and timer are processes of their own (tooling/flood.py):
    on this process's event loop the clients' work would be timed as the gateway's."""
    with tempfile.TemporaryDirectory() as scratch:
        paths = []
        for i, body in enumerate(bodies):
            path = Path(scratch) / f"body{i}.json"
            path.write_bytes(body)
            paths.append(str(path))
        idle = json.loads(await _run_flood_tool("time", gateway + "/health", "0.5"))
        timer = _run_flood_tool("time", gateway + "/health", str(seconds))
        senders = _run_flood_tool("send", gateway + CHAT, str(seconds), *paths)
        health_out, counts_out = await asyncio.gather(timer, senders)
    counts = json.loads(counts_out)
    relayed = Counter({int(k): v for k, v in counts["relayed"].items()})
    own = Counter({int(k): v for k, v in counts["own"].items()})
    return Flood(json.loads(health_out), idle, max(len(b) for b in bodies), relayed, own)


async def _run_flood_tool(*args: str) -> bytes:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tooling.flood", *args,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"tooling.flood {args[0]} exited {proc.returncode}")
    return out


def figure_lines(figures: Figures, timeline: Timeline, flood_: Flood | None) -> list[str]:
    """The figures issue 16 asks to quote, one per line."""
    f, v = figures, figures.verdicts
    lines = [
        f"requests {f.requests}: ok {v['ok']}, broken mid-stream by a kill {v['broken by a kill']}"
        f" (error event + [DONE]), left on purpose {v['left on purpose']}, failed {v['failed']}",
        f"events injected {len(timeline.events)}: {timeline.describe()}",
        f"failures with a healthy backend {len(f.failed_with_healthy)} (with none healthy "
        f"{len(f.failed_without_healthy)}); streams not ending in [DONE] {len(f.bad_streams)}",
    ]
    worst = f.worst_wait
    lines.append(
        f"worst queue wait ratio {worst.ratio if worst else math.nan:.2f} (probe time to first "
        f"token / its unloaded {f.unloaded_ttft_s * 1000:.0f} ms; {f.counted_probes} probes "
        f"counted, {f.saturation_probes} sent during the saturation)"
    )
    for name, wait in (("in", f.worst_in_saturation), ("outside", f.worst_outside_saturation)):
        if wait is not None:
            lines.append(f"  worst {name} the saturation {wait.describe(timeline.t0)}")
    slow = [w for w in f.waits if w.ratio > WAIT_BOUND]
    lines.append(
        f"  over {WAIT_BOUND:g}x: {len(slow)} probes, {len(f.over(WAIT_BOUND))} of them the "
        f"choice's (their twin on the other server under 1/{WAIT_BOUND:g} of their wait)"
    )
    if f.ttft_p50_s is not None:
        lines.append(f"all streams' time to first token p50 {f.ttft_p50_s * 1000:.0f} ms")
    if flood_ is not None:
        own = ", ".join(f"{n}x {s}" for s, n in sorted(flood_.own.items())) or "none"
        relayed = ", ".join(f"{n}x {s}" for s, n in sorted(flood_.relayed.items())) or "none"
        lines.append(
            f"/health p90 under flood {percentile(flood_.health_ms, 0.9):.1f} ms, "
            f"p99 {flood_.p99_ms:.1f} ms ({len(flood_.health_ms)} "
            f"samples, max {max(flood_.health_ms, default=math.nan):.0f} ms; idle p99 "
            f"{p99(flood_.idle_health_ms):.1f} ms; bodies of {flood_.body_bytes / 1e6:.1f} MB, "
            f"answered by the gateway itself: {own}; relayed from a backend: {relayed})"
        )
    groups: dict[str, list[Sent]] = {}
    for s in [*f.failed_with_healthy, *f.failed_without_healthy]:
        groups.setdefault(s.what(), []).append(s)
    for what, alike in groups.items():
        at = sorted({round(s.ended - timeline.t0, 1) for s in alike})
        when = ", ".join(map(str, at)) if len(at) <= 4 else f"{at[0]} to {at[-1]}"
        lines.append(f"failed {len(alike)}x {what}; ended at {when} s")
    return lines
