"""Two engines on ONE GPU, step by step, in virtual time.

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
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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
from classifier.types import two_routes
from gateway.profiling.probes import PROBES
from gateway.wire.life import Lesson
from tooling.emulator.acceptance import (
    base_acceptance,
    classify,
    draw_accepted,
    request_acceptance,
)
from tooling.emulator.config import EmulatorConfig
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
class Job:
    """One request: what the router sees, and what the engine will do with it."""

    workload: str
    features: RequestFeatures
    output_tokens: int
    acceptance: float  # per draft position, this request's truth
    seed: int


def jobs(
    count_per_workload: int,
    *,
    seed: int = 0,
    names: Sequence[str] = MIXED,
    counter: TokenCounter | None = None,
    emulator: EmulatorConfig | None = None,
) -> list[Job]:
    """The built-in workloads' requests, interleaved, with the emulator's truths."""
    counter = counter or load_tiktoken_counter()
    c = emulator or MEASURED_SPEC
    rng = random.Random(seed)
    out: list[Job] = []
    for request in build(list(names), count_per_workload, seed=seed):
        body = request.body
        f = extract_features(body, Endpoint.CHAT, counter)
        text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        kind = classify(structured="response_format" in body, prompt_text=text)
        a = request_acceptance(c, kind, float(body.get("temperature", 1.0)), rng)
        natural = rng.randint(c.text_min_tokens, c.text_max_tokens)
        out_tokens = min(natural, int(body.get("max_tokens") or natural))
        out.append(Job(request.workload, f, out_tokens, a, rng.getrandbits(32)))
    return out


# What the profiler measures (gateway/profiling/probes.py): batches 1, 2, 4, ... 32 and
# prompts of about 16, 256, 1024 and 4096 tokens; 48-token acceptance probes.
PROFILE_BATCHES = (1, 2, 4, 8, 16, 32)
PROFILE_PROMPTS = (16, 256, 1024, 4096)


def _step_s(c: EmulatorConfig, route: Route, shape: StepShape) -> float:
    cost = speculative_step_ms if route == SPEC else baseline_step_ms
    return cost(c, shape) * c.time_scale / 1000.0


def _ttft_s(c: EmulatorConfig, route: Route, prompt_tokens: int) -> float:
    """A lone request's prefill: chunks of the step budget, the first token at the end."""
    total, left = 0.0, prompt_tokens
    while left > 0:
        chunk = min(left, c.max_num_batched_tokens)
        total += _step_s(c, route, StepShape(0, chunk))
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
) -> EngineProfile:
    """What gateway/profiling/probes.py would measure of these engines, noise aside: the step
    per batch and first token per prompt from the emulator's costs, each route's step
    beside a busy neighbour (2: one time-sliced GPU; 1: a GPU each), and per workload
    the probes' tokens per step, from `probes` (per-position a) where given, else the
    emulator's truth."""
    c = emulator or MEASURED_SPEC
    k = c.num_speculative_tokens
    seen = probe_acceptance(c, counter or load_tiktoken_counter())
    seen.update(probes or {})
    tps = {w: (expected_tokens_per_step(a, k), 48) for w, a in seen.items()}

    def route(r: Route) -> RouteProfile:
        spec = r == SPEC
        return RouteProfile(
            r.value,
            ServerIdentity(f"sim://{r.value}", "sim", "sim", "ngram" if spec else "none", k * spec),
            Curve(
                tuple(map(float, PROFILE_PROMPTS)),
                tuple(_ttft_s(c, r, p) for p in PROFILE_PROMPTS),
            ),
            Curve(
                tuple(map(float, PROFILE_BATCHES)),
                tuple(
                    _step_s(c, r, StepShape(b, 0, context_tokens=PROFILE_CONTEXT))
                    for b in PROFILE_BATCHES
                ),
            ),
            tps if spec else {},
            2.0 if gpus == 1 else 1.0,  # processor sharing: two busy servers, half each
        )

    return EngineProfile(
        routes=(route(SPEC), route(BASE)),
        created=datetime.now(UTC).isoformat(),
        took_s=0.0,
        source="emulated",
    )


def profiled(
    emulator: EmulatorConfig | None = None,
    *,
    gpus: int = 1,
    probes: Mapping[Workload, float] | None = None,
    config: RouterConfig | None = None,
    counter: TokenCounter | None = None,
) -> ProfiledPolicy:
    """The gateway's default policy, its start-up profile of these engines in."""
    c = emulator or MEASURED_SPEC
    return ProfiledPolicy(
        config or RouterConfig(),
        routes=two_routes(c.num_speculative_tokens, draft_cost_ratio(c)),
        profile=engine_profile(c, gpus=gpus, probes=probes, counter=counter),
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
) -> list[Served]:
    """A closed loop of `concurrency` clients; the router learns every answer as it goes
    (Policy.learn), and decides with a seeded rng as the gateway does (its exploration).

    gpus=2 gives each engine its own GPU: they step independently.
    """
    c = emulator or MEASURED_SPEC
    k = c.num_speculative_tokens
    learn: Callable[[Lesson], None] = router.learn
    rng = random.Random(seed)
    running: dict[Route, list[_Running]] = {SPEC: [], BASE: []}
    newest = {SPEC: 0, BASE: 0}  # the newest request sent there, numbered from 1
    served: list[Served] = []
    now, sent = 0.0, 0

    def send(at: float) -> None:
        nonlocal sent
        job = requests[sent]
        state = LiveState.pair(*(_backend(running[r], newest[r]) for r in (SPEC, BASE)))
        decision = router.decide(job.features, state, 0, rng)
        route = decision.route
        predicted = decision.predicted_s.get(route) if decision.predicted_s else None
        served.append(Served(job, route, decision.reason, predicted))
        running[route].append(_Running(sent, job, route, at, state))
        sent += 1
        newest[route] = sent

    def begin(route: Route) -> tuple[float, _Step]:
        """One engine step of `route` (scheduled as vLLM v1 does): its cost alone, in s."""
        per_decode = k + 1 if route == SPEC else 1
        budget = c.max_num_batched_tokens
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
        cost_ms = (speculative_step_ms if route == SPEC else baseline_step_ms)(c, shape)
        return cost_ms * c.time_scale / 1000.0, _Step(decode, prefill)

    def complete(route: Route, done: _Step, end: float) -> None:
        for r, chunk in done.prefill:
            r.prefilled += chunk
            if r.prefilled >= r.job.features.prompt_tokens:
                r.generated, r.first_at = 1, end
        for r in done.decode:
            n = 1
            if route == SPEC:
                accepted = draw_accepted(r.job.acceptance, k, r.rng)
                r.drafted += k
                r.accepted += accepted
                n += accepted
            r.generated += n

    for _ in range(min(concurrency, len(requests))):
        send(0.0)

    def finish(route: Route, now: float) -> None:
        for r in [r for r in running[route] if r.generated >= r.job.output_tokens]:
            running[route].remove(r)
            done = served[r.index]
            done.duration_s = now - r.sent_at
            learn(_finished(r, done))
            if sent < len(requests):
                send(now)

    # Each busy engine's step: the work it has left (seconds alone) and what it does.
    # One GPU is processor-shared: while n engines are busy each advances at 1/n.
    work: dict[Route, float] = {}
    steps: dict[Route, _Step] = {}
    while True:
        for route in (SPEC, BASE):
            if route not in work and running[route]:
                work[route], steps[route] = begin(route)
        if not work:
            return served
        share = len(work) if gpus == 1 else 1
        route = min(work, key=work.__getitem__)
        elapsed = work[route]
        now += elapsed * share
        for other in work:
            work[other] -= elapsed
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


def _finished(r: _Running, done: Served) -> Lesson:
    return Lesson(
        route=r.route,
        features=r.job.features,
        state=r.state,
        ttft_s=(r.first_at - r.sent_at) if r.first_at is not None else None,
        duration_s=done.duration_s,
        prompt_tokens=r.job.features.prompt_tokens,
        completion_tokens=r.generated,
        acceptance=(r.accepted / r.drafted) if r.route == SPEC and r.drafted else None,
        predicted_s=done.predicted_s,
    )


def mean_latency(served: Sequence[Served]) -> float:
    return statistics.fmean(s.duration_s for s in served)


def oracle_latency(spec: Sequence[Served], base: Sequence[Served]) -> float:
    """Each request's better time of the two static runs (the benchmark's oracle)."""
    return statistics.fmean(
        min(s.duration_s, b.duration_s) for s, b in zip(spec, base, strict=True)
    )


def mape(served: Sequence[Served], route: Route) -> float:
    """Mean |predicted - measured| / measured on one route (nan if it served nothing)."""
    errors = [
        abs(s.predicted_s - s.duration_s) / s.duration_s
        for s in served
        if s.route is route and s.predicted_s is not None
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
