"""Two engines, or N routes, on ONE GPU, step by step, in virtual time.

(simulate(gpus=2) gives each engine its own GPU, to compare.)

The emulator's timing (tooling/emulator/costs.py: the measured H200's step costs,
the same chunked-prefill budget, the same position-by-position draft acceptance)
without its wall clock, so a router can be run over thousands of requests at any
concurrency in seconds. As with the emulator's SharedGpu, the two engines share
the GPU time-sliced: while both have a step in progress each advances at half its
own speed (an H200 measured 1.86-2.17x each). That is the deployment
(deploy/gpu/launch.sh) and the reason a router cannot simply send each request to
the route that would be faster on an otherwise idle GPU: two half-full batches
each run at half speed where one full batch costs little more than a half one.

The requests are the built-in workloads' own bodies (tooling/workloads.py),
featurised by the gateway's extractor; each one's true acceptance is the
emulator's (tooling/emulator/acceptance.py). The router under test is the
profiled policy on `engine_profile`: what gateway/profiling/probes.py would measure
of these engines (step per batch, first token per prompt, a busy neighbour's
slowdown 2 on one GPU and 1 on a GPU each, the probes' tokens per step), from
the same costs; `probes=` makes the probes see another acceptance than the
traffic's truth, for a router that must learn it. `emulator=` runs another GPU
(ROOFLINE_SPEC: the emulator's first, unmeasured one). Run it for a table:

    .venv/bin/python -m tooling.sim.shared_gpu

N routes (issue 42): `routes=` (SimRoute: a name and an emulated server, its drafter
"eagle3", "draft-1b" or "ngram" and its k, or none; `sim_route` builds one) replaces
the speculative + baseline pair in `engine_profile`, `profiled` and `simulate`. Each
request carries every drafter's true acceptance (Job.by_drafter: the emulator's level
for that drafter, tooling/emulator/acceptance.py DRAFTER_ACCEPTANCE, and one jitter
drawn per request), so a route accepts as its drafter does, and the profile of every
route is what the profiler would measure of it (its step at its own k, its probes with
its own drafter; `probes_of=` sets one route's probes off its truth). On one GPU every
busy server advances at 1/n of its speed, n the servers busy: the H200 measured two
(1.86-2.17x each); three or four are that time-slicing extended, not measured.

Several GPUs, several routes each ([routes.NAME] device): `devices=` (route -> device name)
in `simulate` shares each device by itself (an engine advances at 1/n, n the busy engines
of ITS device), and in `engine_profile`/`profiled` says each route's device in its identity
with beside 2 for a route with a neighbour on its device and 1 for one alone there (what
the profiler measures when told the devices). Without it, gpus= as before.
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from classifier import (
    BackendState,
    Endpoint,
    LiveState,
    Policy,
    RequestFeatures,
    Route,
    StaticPolicy,
    Workload,
)
from classifier.features import extract_features
from classifier.profile import Curve, EngineProfile, RouteProfile, ServerIdentity
from classifier.router import ProfiledPolicy, RouterConfig
from classifier.speculation import expected_tokens_per_step
from classifier.tokens import TokenCounter, load_tiktoken_counter
from classifier.types import RouteSpec
from gateway.profiling.probes import PROBES
from gateway.wire.life import Lesson
from tooling.emulator.acceptance import (
    base_acceptance,
    classify,
    draw_accepted,
    request_acceptance,
)
from tooling.emulator.config import EmulatorConfig, drafter_method, drafter_names
from tooling.emulator.costs import (
    StepShape,
    baseline_step_ms,
    draft_cost_ratio,
    speculative_step_ms,
)
from tooling.workloads import build

SPEC, BASE = Route.SPECULATIVE, Route.BASELINE
MIXED = ["structured", "sql", "code", "creative", "rag", "chat"]

# The emulator's default: the measured H200, 1B draft, k=4.
MEASURED_SPEC = EmulatorConfig(mode="speculative")
# The emulator's first GPU (NOT measured), for comparison.
ROOFLINE_SPEC = EmulatorConfig(mode="speculative", gpu_profile="roofline")
# The step probes' context (gateway/profiling/probes.py: a 4-token prompt, 24 tokens out).
PROFILE_CONTEXT = 20


@dataclass(frozen=True, slots=True)
class SimRoute:
    """One route: its configured name and the emulated server behind it.

    speculative False: that server's GPU and target without a drafter (the pair's
    baseline is its speculative config's GPU, so both price the same target)."""

    name: Route
    emulator: EmulatorConfig
    speculative: bool

    @property
    def k(self) -> int:
        return self.emulator.num_speculative_tokens if self.speculative else 0

    @property
    def drafter(self) -> str | None:
        return self.emulator.drafter if self.speculative else None

    @property
    def label(self) -> str:
        """What it runs, for a table: "eagle3 k=7", "none"."""
        return f"{self.drafter} k={self.k}" if self.speculative else "none"

    def spec(self) -> RouteSpec:
        """What the gateway's [routes.NAME] says of it: vLLM's method, k, the draft's cost."""
        if not self.speculative:
            return RouteSpec(self.name)
        return RouteSpec(
            self.name, self.k, drafter_method(self.emulator), draft_cost_ratio(self.emulator)
        )

    def step_s(self, shape: StepShape) -> float:
        """One engine step of this server, in s."""
        cost = speculative_step_ms if self.speculative else baseline_step_ms
        return cost(self.emulator, shape) * self.emulator.time_scale / 1000.0


def sim_route(
    name: str, drafter: str | None = None, k: int = 0, *, emulator: EmulatorConfig | None = None
) -> SimRoute:
    """A route of the emulated GPU (`emulator`, default the measured H200): `drafter` with
    its k, or none (drafter None, k 0)."""
    c = emulator or MEASURED_SPEC
    if drafter is None:
        if k:
            raise ValueError(f"route {name}: k={k} without a drafter")
        return SimRoute(Route(name), c, speculative=False)
    config = replace(c, mode="speculative", drafter=drafter, num_speculative_tokens=k)
    return SimRoute(Route(name), config, speculative=True)


def pair_routes(emulator: EmulatorConfig | None = None) -> tuple[SimRoute, SimRoute]:
    """The two-route configuration: `emulator`'s speculative server and its baseline."""
    c = emulator or MEASURED_SPEC
    return SimRoute(SPEC, c, speculative=True), SimRoute(BASE, c, speculative=False)


# Issue 42's menu on the measured H200 (its drafters: tooling/emulator/gpu/h200-llama3.1-
# 8b.json "drafters"): no speculation, the EAGLE-3-like head at k=3 and k=7 (the published
# EAGLE-3 acceptance lengths are at K=7), n-gram prompt lookup at k=8.
FOUR_ROUTES = (
    sim_route("none"),
    sim_route("eagle3-k3", "eagle3", 3),
    sim_route("eagle3-k7", "eagle3", 7),
    sim_route("ngram-k8", "ngram", 8),
)


@dataclass(frozen=True, slots=True)
class Job:
    """One request: what the router sees, and what the engine will do with it."""

    workload: str
    features: RequestFeatures
    output_tokens: int
    acceptance: float  # per draft position, this request's truth (the jobs' drafter)
    seed: int
    # The same per drafter the GPU measured (one jitter for all: how predictable this
    # request is); empty: `acceptance` whatever the drafter (a Job built by hand).
    by_drafter: Mapping[str, float] = field(default_factory=dict)

    def acceptance_on(self, route: SimRoute) -> float:
        """Per-position acceptance of this request on `route`'s drafter, its truth."""
        if not self.by_drafter or route.drafter is None:
            return self.acceptance
        return self.by_drafter[route.drafter]


def jobs(
    count_per_workload: int,
    *,
    seed: int = 0,
    names: Sequence[str] = MIXED,
    counter: TokenCounter | None = None,
    emulator: EmulatorConfig | None = None,
) -> list[Job]:
    """The built-in workloads' requests, interleaved, with the emulator's truths (every
    drafter's acceptance; `emulator`'s own knobs, such as acceptance_code, for all)."""
    counter = counter or load_tiktoken_counter()
    c = emulator or MEASURED_SPEC
    configs = {d: c if d == c.drafter else replace(c, drafter=d) for d in _drafters(c)}
    rng = random.Random(seed)
    out: list[Job] = []
    for request in build(list(names), count_per_workload, seed=seed):
        body = request.body
        f = extract_features(body, Endpoint.CHAT, counter)
        text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        kind = classify(structured="response_format" in body, prompt_text=text)
        temperature = float(body.get("temperature", 1.0))
        drawn = rng.getstate()
        by_drafter: dict[str, float] = {}
        for drafter, config in configs.items():  # one draw, the same jitter for each
            rng.setstate(drawn)
            by_drafter[drafter] = request_acceptance(config, kind, temperature, rng)
        natural = rng.randint(c.text_min_tokens, c.text_max_tokens)
        out_tokens = min(natural, int(body.get("max_tokens") or natural))
        a = by_drafter[c.drafter]
        out.append(Job(request.workload, f, out_tokens, a, rng.getrandbits(32), by_drafter))
    return out


def _drafters(c: EmulatorConfig) -> tuple[str, ...]:
    """The drafters `c`'s GPU measured (the roofline: the default GPU's), `c`'s own first."""
    every = drafter_names(c.gpu_profile)
    return (c.drafter, *(d for d in every if d != c.drafter))


# What the profiler measures (gateway/profiling/probes.py): batches 1, 2, 4, ... 32 and
# prompts of about 16, 256, 1024 and 4096 tokens; 48-token acceptance probes.
PROFILE_BATCHES = (1, 2, 4, 8, 16, 32)
PROFILE_PROMPTS = (16, 256, 1024, 4096)


def _ttft_s(route: SimRoute, prompt_tokens: int) -> float:
    """A lone request's prefill: chunks of the step budget, the first token at the end."""
    total, left = 0.0, prompt_tokens
    while left > 0:
        chunk = min(left, route.emulator.max_num_batched_tokens)
        total += route.step_s(StepShape(0, chunk))
        left -= chunk
    return total


def probe_acceptance(c: EmulatorConfig, counter: TokenCounter) -> dict[Workload, float]:
    """Per-position acceptance a the profiler's probes (gateway/profiling/probes.py PROBES) meet
    on this emulator, per router workload: the emulator's level before jitter."""
    out: dict[Workload, float] = {}
    for body in PROBES:
        workload = extract_features(body, Endpoint.CHAT, counter).workload
        text = " ".join(str(m.get("content", "")) for m in body["messages"])
        kind = classify(structured="response_format" in body, prompt_text=text)
        out[workload] = base_acceptance(c, kind, float(body.get("temperature", 1.0)))
    return out


def engine_profile(
    emulator: EmulatorConfig | None = None,
    *,
    gpus: int = 1,
    probes: Mapping[Workload, float] | None = None,
    counter: TokenCounter | None = None,
    routes: Sequence[SimRoute] | None = None,
    probes_of: Mapping[Route, Mapping[Workload, float]] | None = None,
    devices: Mapping[Route, str] | None = None,
) -> EngineProfile:
    """What gateway/profiling/probes.py would measure of these engines, noise aside: the step
    per batch and first token per prompt from the emulator's costs, each route's step
    beside a busy neighbour (2: one time-sliced GPU; 1: a GPU each), and per workload
    the probes' tokens per step at each speculative route's own k, from its drafter's
    acceptance (the emulator's truth) where `probes_of` does not set that route's
    per-position a (`probes`: the pair's speculative route's).

    routes: the servers (default: `emulator`'s speculative one and its baseline).
    devices: each route's device (every route's; then `gpus` is not used)."""
    c = emulator or MEASURED_SPEC
    table = tuple(routes or pair_routes(c))
    _check_devices(devices, table, gpus)
    wrong: dict[Route, Mapping[Workload, float]] = dict(probes_of or {})
    if probes:
        wrong[SPEC] = {**wrong.get(SPEC, {}), **probes}
    unknown = [r for r in wrong if r not in {t.name for t in table}]
    if unknown:
        raise ValueError(f"probes for route(s) {unknown} not among {[t.name for t in table]}")
    counter = counter or load_tiktoken_counter()
    return EngineProfile(
        routes=tuple(
            _route_profile(r, gpus, wrong.get(r.name, {}), counter, devices) for r in table
        ),
        created=datetime.now(UTC).isoformat(),
        took_s=0.0,
        source="emulated",
    )


def _check_devices(
    devices: Mapping[Route, str] | None, table: Sequence[SimRoute], gpus: int
) -> None:
    """devices, if given, names the device of exactly the routes of `table`, gpus left 1."""
    if devices is None:
        return
    if set(devices) != {r.name for r in table}:
        raise ValueError(f"devices {dict(devices)} not for routes {[r.name for r in table]}")
    if gpus != 1:
        raise ValueError("devices= or gpus=, not both")


def _route_profile(
    r: SimRoute,
    gpus: int,
    probes: Mapping[Workload, float],
    counter: TokenCounter,
    devices: Mapping[Route, str] | None = None,
) -> RouteProfile:
    # processor sharing: two busy servers, half each (none on its device or GPU: 1)
    if devices is None:
        device, beside = "", 2.0 if gpus == 1 else 1.0
    else:
        device = devices[r.name]
        beside = 2.0 if list(devices.values()).count(device) > 1 else 1.0
    tps: dict[Workload, tuple[float, int]] = {}
    if r.speculative:
        seen = {**probe_acceptance(r.emulator, counter), **probes}
        tps = {w: (expected_tokens_per_step(a, r.k), 48) for w, a in seen.items()}
    return RouteProfile(
        r.name.value,
        ServerIdentity(f"sim://{r.name.value}", "sim", "sim", r.spec().method, r.k, device=device),
        Curve(
            tuple(map(float, PROFILE_PROMPTS)),
            tuple(_ttft_s(r, p) for p in PROFILE_PROMPTS),
        ),
        Curve(
            tuple(map(float, PROFILE_BATCHES)),
            tuple(
                r.step_s(StepShape(b, 0, context_tokens=PROFILE_CONTEXT)) for b in PROFILE_BATCHES
            ),
        ),
        tps,
        beside,
    )


def profiled(
    emulator: EmulatorConfig | None = None,
    *,
    gpus: int = 1,
    probes: Mapping[Workload, float] | None = None,
    config: RouterConfig | None = None,
    counter: TokenCounter | None = None,
    routes: Sequence[SimRoute] | None = None,
    probes_of: Mapping[Route, Mapping[Workload, float]] | None = None,
    devices: Mapping[Route, str] | None = None,
) -> ProfiledPolicy:
    """The gateway's default policy over `routes` (default: the pair), its start-up profile
    of these engines in."""
    table = tuple(routes or pair_routes(emulator))
    return ProfiledPolicy(
        config or RouterConfig(),
        routes=[r.spec() for r in table],
        profile=engine_profile(
            emulator,
            gpus=gpus,
            probes=probes,
            counter=counter,
            routes=table,
            probes_of=probes_of,
            devices=devices,
        ),
    )


@dataclass(slots=True)
class Served:
    job: Job
    route: Route
    reason: str
    predicted_s: float | None
    duration_s: float = 0.0


class _Running:
    __slots__ = (
        "accepted",
        "drafted",
        "first_at",
        "generated",
        "index",
        "job",
        "prefilled",
        "rng",
        "route",
        "sent_at",
        "state",
    )

    def __init__(self, index: int, job: Job, route: Route, now: float, state: LiveState) -> None:
        self.index, self.job, self.route, self.sent_at = index, job, route, now
        self.state = state  # what the decision saw, for learn()
        self.prefilled = self.generated = self.drafted = self.accepted = 0
        self.first_at: float | None = None
        self.rng = random.Random(job.seed)


def simulate(
    router: Policy,
    requests: Sequence[Job],
    concurrency: int,
    *,
    emulator: EmulatorConfig | None = None,
    gpus: int = 1,
    seed: int = 0,
    routes: Sequence[SimRoute] | None = None,
    devices: Mapping[Route, str] | None = None,
    arrivals: Sequence[float] | None = None,
) -> list[Served]:
    """A closed loop of `concurrency` clients, or open-loop `arrivals` (each request's
    send time, s: `poisson_arrivals`; then `concurrency` is not used); the router learns
    every answer as it goes (Policy.learn), and decides with a seeded rng as the gateway
    does (its exploration).

    routes: the servers (default: `emulator`'s speculative one and its baseline), in the
    configuration's order. gpus=1: all on one time-sliced GPU; 2 (or more): each server
    its own GPU, stepping independently. devices: each route's device (then not `gpus`),
    each device time-sliced among its own busy servers only.
    """
    table = {r.name: r for r in (routes or pair_routes(emulator))}
    _check_devices(devices, list(table.values()), gpus)
    learn: Callable[[Lesson], None] = router.learn
    rng = random.Random(seed)
    running: dict[Route, list[_Running]] = {r: [] for r in table}
    newest = dict.fromkeys(table, 0)  # the newest request sent there, numbered from 1
    served: list[Served] = []
    now, sent = 0.0, 0

    def send(at: float) -> None:
        nonlocal sent
        job = requests[sent]
        state = LiveState({r: _backend(running[r], newest[r]) for r in table})
        decision = router.decide(job.features, state, rng)
        route = decision.route
        predicted = decision.predicted_s.get(route) if decision.predicted_s else None
        served.append(Served(job, route, decision.reason, predicted))
        running[route].append(_Running(sent, job, route, at, state))
        sent += 1
        newest[route] = sent

    def begin(route: Route) -> tuple[float, _Step]:
        """One engine step of `route` (scheduled as vLLM v1 does): its cost alone, in s."""
        server = table[route]
        per_decode = server.k + 1
        budget = server.emulator.max_num_batched_tokens
        decode = [r for r in running[route] if r.prefilled >= r.job.features.prompt_tokens]
        decode = decode[: budget // per_decode]
        budget -= len(decode) * per_decode
        prefill: list[tuple[_Running, int]] = []
        for r in running[route]:
            left = r.job.features.prompt_tokens - r.prefilled
            if left > 0 and budget > 0:
                prefill.append((r, min(left, budget)))
                budget -= prefill[-1][1]
        context = (
            statistics.fmean(r.job.features.prompt_tokens + r.generated for r in decode)
            if decode
            else PROFILE_CONTEXT
        )
        shape = StepShape(len(decode), sum(chunk for _, chunk in prefill), context_tokens=context)
        return server.step_s(shape), _Step(decode, prefill)

    def complete(route: Route, done: _Step, end: float) -> None:
        for r, chunk in done.prefill:
            r.prefilled += chunk
            if r.prefilled >= r.job.features.prompt_tokens:
                r.generated, r.first_at = 1, end
        server = table[route]
        k = server.k
        for r in done.decode:
            n = 1
            if server.speculative:
                accepted = draw_accepted(r.job.acceptance_on(server), k, r.rng)
                r.drafted += k
                r.accepted += accepted
                n += accepted
            r.generated += n

    if arrivals is not None and len(arrivals) < len(requests):
        raise ValueError(f"{len(arrivals)} arrival times for {len(requests)} requests")
    if arrivals is None:
        for _ in range(min(concurrency, len(requests))):
            send(0.0)

    def finish(route: Route, now: float) -> None:
        for r in [r for r in running[route] if r.generated >= r.job.output_tokens]:
            running[route].remove(r)
            done = served[r.index]
            done.duration_s = now - r.sent_at
            learn(_finished(r, done, speculative=table[route].speculative))
            if arrivals is None and sent < len(requests):
                send(now)

    def arrive(until: float) -> float:
        """Open loop: send every request due by `until`; the next one's time (or inf)."""
        while arrivals is not None and sent < len(requests) and arrivals[sent] <= until:
            send(arrivals[sent])
        if arrivals is None or sent >= len(requests):
            return float("inf")
        return arrivals[sent]

    # Each busy engine's step: the work it has left (seconds alone) and what it does.
    # One GPU is processor-shared: while n engines are busy each advances at 1/n; with
    # devices, n is the busy engines of its own device.
    work: dict[Route, float] = {}
    steps: dict[Route, _Step] = {}
    coming = arrive(now)
    while True:
        for route in table:
            if route not in work and running[route]:
                work[route], steps[route] = begin(route)
        if not work:
            if coming == float("inf"):
                return served
            now = coming
            coming = arrive(now)
            continue
        if devices is None:
            share = len(work) if gpus == 1 else 1
            slowed = dict.fromkeys(work, share)
        else:
            busy = Counter(devices[r] for r in work)
            slowed = {r: busy[devices[r]] for r in work}
        route = min(work, key=lambda r: work[r] * slowed[r])
        dt = work[route] * slowed[route]
        if now + dt > coming:  # a request arrives mid-step: it joins at the next step
            for other in work:
                work[other] -= (coming - now) / slowed[other]
            now = coming
            coming = arrive(now)
            continue
        now += dt
        for other in work:
            work[other] -= dt / slowed[other]
        del work[route]
        complete(route, steps.pop(route), now)
        finish(route, now)


@dataclass(slots=True)
class _Step:
    decode: list[_Running]
    prefill: list[tuple[_Running, int]]


def _backend(running: Sequence[_Running], newest: int) -> BackendState:
    """What the gateway knows of one engine: its requests, their workloads, the prompts
    not yet answered and the newest request sent there."""
    prefilling = sum(r.job.features.prompt_tokens for r in running if r.first_at is None)
    mix = Counter(r.job.features.workload for r in running)
    return BackendState(
        inflight=len(running),
        prefill_tokens=prefilling,
        mix=tuple(sorted(mix.items())),
        last_start=newest,
    )


def _finished(r: _Running, done: Served, *, speculative: bool) -> Lesson:
    return Lesson(
        route=r.route,
        features=r.job.features,
        state=r.state,
        ttft_s=(r.first_at - r.sent_at) if r.first_at is not None else None,
        duration_s=done.duration_s,
        prompt_tokens=r.job.features.prompt_tokens,
        completion_tokens=r.generated,
        acceptance=(r.accepted / r.drafted) if speculative and r.drafted else None,
        predicted_s=done.predicted_s,
    )


def poisson_arrivals(count: int, rate: float, seed: int = 0) -> list[float]:
    """`count` send times of a Poisson process of `rate` requests/s, from 0."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    rng, at, out = random.Random(seed), 0.0, []
    for _ in range(count):
        at += rng.expovariate(rate)
        out.append(at)
    return out


def mean_latency(served: Sequence[Served]) -> float:
    return statistics.fmean(s.duration_s for s in served)


def oracle_latency(*runs: Sequence[Served]) -> float:
    """Each request's best time of the static runs (the benchmark's oracle): the pair's
    two, or one per route of N, all of the same requests."""
    return statistics.fmean(min(s.duration_s for s in each) for each in zip(*runs, strict=True))


def oracle_routes(runs: Mapping[Route, Sequence[Served]]) -> list[Route]:
    """Per request, the route whose static run served it fastest (the oracle's choice)."""
    names = list(runs)
    return [
        names[min(range(len(each)), key=lambda i: each[i].duration_s)]
        for each in zip(*runs.values(), strict=True)
    ]


def mape(served: Sequence[Served], route: Route) -> float:
    """Mean |predicted - measured| / measured on one route (nan if it served nothing)."""
    errors = [
        abs(s.predicted_s - s.duration_s) / s.duration_s
        for s in served
        if s.route == route and s.predicted_s is not None
    ]
    return statistics.fmean(errors) if errors else float("nan")


def report(per_workload: int = 150, gpus: int = 1) -> None:
    """One policy through rising load, as benchmarks/policy_vs_oracle.py runs the emulator."""
    requests = jobs(per_workload, seed=3)
    policy = profiled(gpus=gpus)
    where = "ONE GPU" if gpus == 1 else "a GPU per server"
    print(f"\n{len(requests)} requests a level, of {', '.join(MIXED)}; {where} (virtual time)")
    print(
        "mean e2e / the per-request oracle's; 'unaware' is the same policy on a profile "
        "that says a GPU each (beside 1), so it routes each request alone"
    )
    print(
        "conc    profiled  unaware  all-spec  all-base  | MAPE spec  base "
        "| given length: spec  base | consolidate"
    )
    for concurrency in (1, 2, 4, 8, 16, 32):
        spec = simulate(StaticPolicy(SPEC), requests, concurrency, gpus=gpus)
        base = simulate(StaticPolicy(BASE), requests, concurrency, gpus=gpus)
        best = oracle_latency(spec, base)
        unaware = simulate(profiled(gpus=2), requests, concurrency, gpus=gpus)
        before = policy.error_totals()
        ours = simulate(policy, requests, concurrency, gpus=gpus)
        after = policy.error_totals()
        fit = {r: e.since(before.get(r)).mape()[1] for r, e in after.items()}
        ratios = [mean_latency(x) / best for x in (ours, unaware, spec, base)]
        kept = sum(s.reason == "consolidate" for s in ours) / len(ours)
        print(
            f"{concurrency:>4}  {ratios[0]:10.3f}  {ratios[1]:7.3f}  {ratios[2]:8.3f}  "
            f"{ratios[3]:8.3f}  | {mape(ours, SPEC):9.3f}  {mape(ours, BASE):4.3f} "
            f"| {fit.get(SPEC, float('nan')):18.3f}  {fit.get(BASE, float('nan')):4.3f} | "
            f"{kept:11.0%}"
        )


if __name__ == "__main__":
    report(gpus=1)
    report(gpus=2)  # 'unaware' is then the same profile as the policy's
