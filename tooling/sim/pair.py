"""A small synthetic serving pair, a GPU per server, for the router in virtual time.

`outcome(route, features, batch, seed)` is a pure function: what one request
would measure on one route when it joins a batch of `batch` sequences. Its
costs follow the emulator's engine shape (tooling/emulator/config.py): a step
costs a fixed overhead, a weights read, per-sequence KV reads and per-token
compute; a speculative step also runs the draft k times (each c x a target
step), verifies k + 1 tokens per sequence and pays a rejection-sampler
overhead; draft tokens are accepted position by position with the workload's
probability a (plus per-request jitter) until the first rejection. Latencies
carry lognormal noise. While a request decodes, the others in flight on its route
are each replaced about once (a closed loop), and each arrival's prefill lengthens
its steps, as a real engine's chunked prefill does (`arrival_prompt_tokens`: the
mix's mean prompt). The policy under test sees these costs only as a
profiler would measure them (`engine_profile`: step per batch, first token per
prompt, overlap 0, noise-free); its probes' acceptance can be set off the
truth (`probes=`, e.g. WRONG_PROBES), which it must then learn from answers.

`simulate` runs a closed loop of `concurrency` clients, each sending its next
request when the previous one finishes, so routing changes the batches. A table:

    .venv/bin/python -m tooling.sim.pair
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from classifier import (
    BackendState,
    Decision,
    Endpoint,
    LiveState,
    Policy,
    RequestFeatures,
    Route,
    Workload,
)
from classifier.profile import Curve, EngineProfile, RouteProfile, ServerIdentity
from classifier.router import ProfiledPolicy, RouterConfig
from classifier.speculation import expected_tokens_per_step
from classifier.types import two_routes
from gateway.wire.life import Lesson

SPEC, BASE = Route.SPECULATIVE, Route.BASELINE

TRUE_ACCEPTANCE = {
    Workload.STRUCTURED: 0.85,
    Workload.CODE: 0.75,
    Workload.CHAT: 0.45,
    Workload.CREATIVE: 0.2,
    Workload.LONG_CONTEXT: 0.55,
}


# Probes that saw one acceptance for every kind (per-position a): up to 0.4 off the truth.
WRONG_PROBES = dict.fromkeys(TRUE_ACCEPTANCE, 0.6)


@dataclass(frozen=True)
class Engine:
    overhead_s: float = 0.002
    weights_s: float = 0.006
    kv_per_seq_s: float = 0.0003
    compute_per_token_s: float = 0.00025
    k: int = 4
    c: float = 0.2
    spec_overhead_s: float = 0.002
    draft_prefill_ratio: float = 0.05
    noise: float = 0.05
    jitter: float = 0.05
    acceptance: dict[Workload, float] = field(default_factory=lambda: dict(TRUE_ACCEPTANCE))
    # The mix's mean prompt and answer (mixed_requests: about 1,400 and 270 tokens).
    arrival_prompt_tokens: int = 1400
    arrival_output_tokens: int = 270

    def step_s(self, route: Route, batch: int) -> float:
        target = self.overhead_s + self.weights_s + self.kv_per_seq_s * batch
        one = target + self.compute_per_token_s * batch
        if route == BASE:
            return one
        verify = target + self.compute_per_token_s * batch * (self.k + 1)
        return verify + self.k * self.c * one + self.spec_overhead_s

    def ttft_s(self, route: Route, prompt_tokens: int) -> float:
        prefill = self.overhead_s + self.weights_s + self.compute_per_token_s * prompt_tokens
        return prefill * (1.0 + self.draft_prefill_ratio if route == SPEC else 1.0)


def engine_profile(engine: Engine, probes: Mapping[Workload, float] | None = None) -> EngineProfile:
    """What a profiler measures of `engine`, noise aside: steps at batch 1, 2, 4 .. 32,
    first tokens at prompts of 16, 256 and 1024 tokens, a GPU each (beside 1), and
    per workload the probes' tokens per step at `probes` (else the truth's a)."""
    seen = {**engine.acceptance, **(probes or {})}
    batches = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
    prompts = (16.0, 256.0, 1024.0)

    def route(r: Route) -> RouteProfile:
        k = engine.k if r == SPEC else 0
        return RouteProfile(
            r.value,
            ServerIdentity(f"sim://{r.value}", "sim", "sim", "ngram" if k else "none", k),
            Curve(prompts, tuple(engine.ttft_s(r, int(p)) for p in prompts)),
            Curve(batches, tuple(engine.step_s(r, int(b)) for b in batches)),
            {w: (expected_tokens_per_step(a, k), 48) for w, a in seen.items()} if k else {},
        )

    return EngineProfile((route(SPEC), route(BASE)), "", 0.0, "emulated")


def profiled(
    engine: Engine,
    probes: Mapping[Workload, float] | None = None,
    config: RouterConfig | None = None,
) -> ProfiledPolicy:
    return ProfiledPolicy(
        config or RouterConfig(),
        routes=two_routes(engine.k, engine.c),
        profile=engine_profile(engine, probes),
    )


@dataclass(frozen=True)
class Outcome:
    ttft_s: float
    duration_s: float
    completion_tokens: int
    acceptance: float | None


def outcome(engine: Engine, route: Route, f: RequestFeatures, batch: int, seed: int) -> Outcome:
    """What this request measures on `route` in a batch of `batch` (pure in its arguments)."""
    rng = random.Random(seed)
    out = max(1, round(f.expected_output_tokens * rng.uniform(0.7, 1.0)))
    alpha = min(0.99, max(0.0, engine.acceptance[f.workload] + rng.uniform(-1, 1) * engine.jitter))
    noise = {r: math.exp(rng.gauss(0.0, engine.noise)) for r in (SPEC, BASE)}
    ttft = engine.ttft_s(route, f.prompt_tokens) * noise[route]
    if route == BASE:
        steps, acceptance = out - 1, None
    else:
        steps, accepted, remaining = 0, 0, out - 1
        log_a = math.log(alpha) if alpha > 0 else -math.inf
        while remaining > 0:
            u = 1.0 - rng.random()
            run = engine.k if log_a == 0 else min(engine.k, int(math.log(u) / log_a))
            steps += 1
            accepted += run
            remaining -= run + 1
        acceptance = accepted / (steps * engine.k) if steps else None
    arrivals = (batch - 1) * min(1.0, out / engine.arrival_output_tokens)
    prefill = engine.ttft_s(route, engine.arrival_prompt_tokens) - engine.ttft_s(route, 0)
    duration = ttft + (steps * engine.step_s(route, batch) + arrivals * prefill) * noise[route]
    return Outcome(ttft, duration, out, acceptance)


def features(
    workload: Workload,
    prompt_tokens: int,
    max_tokens: int | None,
    temperature: float,
    *,
    code_like: bool = False,
) -> RequestFeatures:
    return RequestFeatures(
        endpoint=Endpoint.CHAT,
        structured=workload is Workload.STRUCTURED,
        temperature=temperature,
        top_p=None,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        expected_output_tokens=256 if max_tokens is None else max_tokens,
        stream=True,
        n=1,
        code_like=code_like,
        workload=workload,
    )


def mixed_requests(count: int, seed: int) -> list[tuple[RequestFeatures, int]]:
    """A mix of the five workloads, each with its own per-request seed."""
    rng = random.Random(seed)
    out: list[tuple[RequestFeatures, int]] = []
    for _ in range(count):
        kind = rng.choice(list(Workload))
        if kind is Workload.STRUCTURED:
            f = features(kind, rng.randint(200, 800), 256, 0.0)
        elif kind is Workload.CODE:
            f = features(kind, rng.randint(300, 1500), 384, 0.2, code_like=True)
        elif kind is Workload.CREATIVE:
            f = features(kind, rng.randint(50, 200), 384, 1.1)
        elif kind is Workload.LONG_CONTEXT:
            f = features(kind, rng.randint(3000, 7000), 64, 0.3)
        else:
            f = features(kind, rng.randint(100, 600), None, 0.7)
        out.append((f, rng.getrandbits(32)))
    return out


@dataclass
class Served:
    features: RequestFeatures
    route: Route
    reason: str
    predicted_s: float | None
    outcome: Outcome


Chooser = Callable[[RequestFeatures, int, LiveState], Decision]


def oracle(engine: Engine) -> Chooser:
    """Sends each request to whichever route its own realised outcome is faster on."""

    def choose(f: RequestFeatures, seed: int, state: LiveState) -> Decision:
        times = {
            r: outcome(engine, r, f, state.of(r).inflight + 1, seed).duration_s
            for r in (SPEC, BASE)
        }
        return Decision(min(times, key=times.__getitem__), "oracle")

    return choose


def simulate(
    engine: Engine,
    router: Policy | Chooser,
    requests: Sequence[tuple[RequestFeatures, int]],
    concurrency: int,
    seed: int = 0,
) -> list[Served]:
    """Closed loop; a policy decides with a seeded rng (as the gateway) and learns
    every outcome."""
    inflight = {SPEC: 0, BASE: 0}
    served: list[Served] = []
    events: list[tuple[float, int, Route, Lesson]] = []
    learn = getattr(router, "learn", None)
    rng = random.Random(seed)
    now, sent = 0.0, 0

    def send() -> None:
        nonlocal sent
        f, seed = requests[sent]
        sent += 1
        state = LiveState.pair(
            BackendState(inflight=inflight[SPEC]), BackendState(inflight=inflight[BASE])
        )
        if callable(router) and not hasattr(router, "decide"):
            decision = router(f, seed, state)
        else:
            decision = router.decide(f, state, rng)
        route = decision.route
        batch = inflight[route] + 1
        result = outcome(engine, route, f, batch, seed)
        predicted = decision.predicted_s[route] if decision.predicted_s else None
        served.append(Served(f, route, decision.reason, predicted, result))
        inflight[route] += 1
        obs = Lesson(
            route=route,
            features=f,
            state=state,
            ttft_s=result.ttft_s,
            duration_s=result.duration_s,
            prompt_tokens=f.prompt_tokens,
            completion_tokens=result.completion_tokens,
            acceptance=result.acceptance,
            predicted_s=predicted,
        )
        heapq.heappush(events, (now + result.duration_s, sent, route, obs))

    for _ in range(min(concurrency, len(requests))):
        send()
    while events:
        now, _, route, obs = heapq.heappop(events)
        inflight[route] -= 1
        if learn is not None:
            learn(obs)
        if sent < len(requests):
            send()
    return served


def mean_latency(served: Sequence[Served]) -> float:
    return sum(s.outcome.duration_s for s in served) / len(served)


def mape(served: Sequence[Served], route: Route) -> float:
    errors = [
        abs(s.predicted_s - s.outcome.duration_s) / s.outcome.duration_s
        for s in served
        if s.route is route and s.predicted_s is not None
    ]
    return sum(errors) / len(errors)


def report(count: int = 3000, seed: int = 11) -> None:
    """Print policy / static / rules / oracle mean latency ratios, MAPE and acceptance error."""
    from classifier import RulesConfig, RulesPolicy, StaticPolicy

    engine = Engine()
    requests = mixed_requests(count, seed)
    print(f"{count} requests, mixed workload; mean e2e latency / oracle's (whole run)")
    print("(the profiled policy's probes: a = 0.6 for every workload, WRONG_PROBES)")
    print("conc    profiled  rules  all-spec  all-base  | MAPE spec  base | max |a err|")
    for concurrency in (1, 8, 32):
        policy = profiled(engine, WRONG_PROBES)
        runs: dict[str, list[Served]] = {}
        for name, router in (
            ("profiled", policy),
            ("rules", RulesPolicy(RulesConfig())),
            ("spec", StaticPolicy(SPEC)),
            ("base", StaticPolicy(BASE)),
            ("oracle", oracle(engine)),
        ):
            runs[name] = simulate(engine, router, requests, concurrency)
        best = mean_latency(runs["oracle"])
        ratios = [mean_latency(runs[n]) / best for n in ("profiled", "rules", "spec", "base")]
        late = runs["profiled"][count // 2 :]
        believed = policy.estimated_acceptance()[SPEC]
        err = max(abs(a - TRUE_ACCEPTANCE[w]) for w, a in believed.items())
        print(
            f"{concurrency:>4}  {ratios[0]:10.3f}  {ratios[1]:5.3f}  {ratios[2]:8.3f}  "
            f"{ratios[3]:8.3f}  | {mape(late, SPEC):9.3f}  {mape(late, BASE):4.3f} | {err:.3f}"
        )


if __name__ == "__main__":
    report()
