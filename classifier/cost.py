"""How a route is priced (the formulas in classifier/router.py's docstring), from the
profile (the machine's), the live state, and what the traffic taught (Learned).

beside_r is the profile's measured ratio of r's step beside a busy neighbour to its
step alone: about 2 on one GPU, whose two vLLM processes are time-sliced (an H200:
1.86-2.17, whatever the neighbour's step), about 1 with a GPU each.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from classifier.features import RequestFeatures, Workload
from classifier.output_length import OutputLengthModel
from classifier.profile import Curve, EngineProfile, RouteProfile, ServerIdentity
from classifier.speculation import Schedule, acceptance_rate, alpha_from_rate, k_at
from classifier.traffic import Traffic
from classifier.types import TWO_ROUTES, BackendState, LiveState, Route, RouteSpec

# An in-flight request started at a uniformly random earlier time has, on
# average, half a life of the same length left: the share of a new request's
# decode that overlaps each request in flight, for what it adds to them.
_OVERLAP_SHARE = 0.5
# The traffic's workload shares follow the last ~1000 answers, and the followers' horizon
# is at most that many requests. Over 100 answers a kind's share has a sampling sd of
# about 5 points, enough to flip the carrier of a mix whose two carriers are within 10%
# (benchmarks/open_loop.py, 1B draft, moderate load, seed 2: 1.107x the better static
# route at 100, 1.019x at 1000, the rest unchanged); bursts of one kind are followed by
# the traffic's stickiness, not by its memory (benchmarks/one_gpu_scenarios.py: the
# same figures at both).
TRAFFIC_MEMORY = 1000.0
# The built-in prior (prior_profile): the talk's 8B target on the measured H200
# (tooling/emulator/gpu/measured): first token 15 ms + 0.03 ms per prompt token (119 ms
# at 4k measured), a step 6 ms + 0.05 ms per sequence (6.06 ms at batch 1, 7.61 at 32).
_PRIOR_TTFT_S, _PRIOR_TTFT_PER_TOKEN_S = 0.015, 0.00003
_PRIOR_STEP_S, _PRIOR_STEP_PER_SEQ_S = 0.006, 0.00005
_PRIOR_BESIDE = 2.0  # one time-sliced GPU, as deploy/gpu runs the pair
# The dynamic-speculation routes' K per batch size (RouteSpec.k_by_batch), by route:
# none, every route static.
STATIC: Mapping[Route, Schedule] = MappingProxyType({})
# A dynamic route's rho at its most k, as the drafter's a (to price it at a smaller K):
# the beliefs' means change once per answer, so a decision finds them here.
_alpha = functools.lru_cache(maxsize=4096)(alpha_from_rate)


@dataclass(frozen=True, slots=True)
class Prediction:
    e2e_s: float
    cost_s: float
    tokens_per_step: float
    decode_steps: float
    first_token_s: float  # of e2e_s: the queue and the first token
    k: int = 0  # the drafts a step proposes at the batch it joins (0: no speculation)


@dataclass(frozen=True, slots=True)
class Learned:
    """What the traffic taught, as the prices read it (the policy's, never written here)."""

    traffic: Traffic
    outputs: OutputLengthModel
    drift: Callable[[Route], float]  # measured / profiled decode time
    rate: Callable[[Route, RequestFeatures], float]  # the request's mean rho there
    workload_rate: Callable[[Route, Workload], float]  # the workload's mean rho there
    failure: Callable[[Route, Workload], float]  # the route's failure rate


def prior_profile(routes: Sequence[RouteSpec] = TWO_ROUTES) -> EngineProfile:
    """What the router assumes before the profile is in, labelled "prior" so every
    decision made on it says "unprofiled": the talk's 8B target on the measured H200
    (the _PRIOR_* figures), each speculative step x (1 + K*c) at the K its batch size
    gives, the routes of a device (as configured; none said: one) time-sliced on it."""
    batches = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
    base_step = tuple(_PRIOR_STEP_S + _PRIOR_STEP_PER_SEQ_S * b for b in batches)
    longest = 4096.0

    def route(spec: RouteSpec) -> RouteProfile:
        # A draft model prefills the prompt too, at its share of the target's cost (the
        # measured H200's 1B draft: a 1500-token prefill step 50 ms against 43 alone).
        prefill = 1.0 + spec.draft_cost_ratio
        return RouteProfile(
            name=spec.name.value,
            identity=ServerIdentity("", "", "unknown", spec.method, spec.k, device=spec.device),
            ttft=Curve(
                (1.0, longest),
                tuple(
                    (_PRIOR_TTFT_S + _PRIOR_TTFT_PER_TOKEN_S * n) * prefill for n in (1.0, longest)
                ),
            ),
            step=Curve(
                batches,
                tuple(
                    s * (1.0 + spec.k_at(b) * spec.draft_cost_ratio)
                    for b, s in zip(batches, base_step, strict=True)
                ),
            ),
            beside=_PRIOR_BESIDE,
        )

    return EngineProfile(
        routes=tuple(route(spec) for spec in routes),
        created="",
        took_s=0.0,
        source="prior",
    )


def route_of(profile: EngineProfile, route: Route) -> RouteProfile:
    found = profile.route(route.value)
    if found is None:  # use_profile checked both are there
        raise KeyError(route.value)
    return found


def routes_of(profile: EngineProfile) -> tuple[Route, ...]:
    """The profile's routes in its order: the decision takes the cheapest of a list,
    so another speculative configuration is one more entry."""
    return tuple(Route(r.name) for r in profile.routes)


def _prefill_of(route: RouteProfile, prompt_tokens: float) -> float:
    """What one prompt's prefill adds to a busy server's steps: its first-token time
    over an empty prompt's (on a measured H200, a 512-token chunk in a batch-8 step
    added 10.9 ms where the prefill table grows 10.4 ms)."""
    if prompt_tokens <= 0:
        return 0.0
    return max(route.ttft.at(prompt_tokens) - route.ttft.at(1.0), 0.0)


def _drafts(route: RouteProfile, schedule: Schedule, batch: float) -> int:
    """The K its steps propose at this batch size: its k, or its schedule's K there."""
    return k_at(schedule, batch, route.identity.num_speculative_tokens)


def _tau(route: RouteProfile, rho: float, drafts: int | None = None) -> float:
    """Tokens one step yields there: 1 + k * rho speculative (its own k), 1 without. rho
    is the rate at its k; a dynamic route proposing `drafts` < k takes the drafter's a
    at that K (K = 0: one token a step, as without speculation)."""
    k = route.identity.num_speculative_tokens
    if drafts is None or drafts == k:
        return 1.0 + k * rho
    if drafts <= 0:
        return 1.0
    return 1.0 + drafts * acceptance_rate(_alpha(rho, k), drafts)


def price(
    profile: EngineProfile,
    f: RequestFeatures,
    state: LiveState,
    route: Route,
    rho: float,
    learned: Learned,
    output_tokens: float | None = None,
    schedules: Mapping[Route, Schedule] = STATIC,
) -> Prediction:
    """The request's time on `route` at acceptance `rho` (the rate at its k), and its cost
    to everyone; a route in `schedules` proposes its K at the batch it joins."""
    here, me = state.of(route), route_of(profile, route)
    others = [(r, state.of(r), route_of(profile, r)) for r in routes_of(profile) if r != route]
    n = max(f.n, 1)
    batch = min(here.load, here.capacity or math.inf)
    drafts = _drafts(me, schedules.get(route, ()), min(batch + n, here.capacity or math.inf))
    tau = _tau(me, rho, drafts)
    out = learned.outputs.predict(f) if output_tokens is None else output_tokens
    steps = max(out - 1.0, 0.0) / tau
    drift = learned.drift(route)
    # Time-sliced: while a neighbour on its device is busy, each step takes its share.
    busy = _busy_beside(profile, state, route)
    slowdown = me.slowdown(len(busy))
    step = me.step.at(min(batch + n, here.capacity or math.inf)) * drift * slowdown
    # A prefill is a step too, sliced alike (the emulator's SharedGpu shares every step;
    # the H200's pair rows measured decode steps at 1.86-2.17x). Unslowed, an idle
    # neighbour of a busy batch looked faster to a TTFT target than it was
    # (benchmarks/slo.py, the pair on one GPU, no regret bound: mean 1.90x -> 1.13x).
    ttft = me.ttft.at(f.prompt_tokens + here.prefill_tokens) * slowdown
    # While it decodes, the requests in flight there end and others like them arrive
    # (a closed loop replaces each about once a life): their prompts' prefill chunks
    # lengthen the steps it is in.
    prefills = 0.0
    # Only on a measured first-token curve: the prior's is a guess, and this term
    # multiplies it by the batch (on the prior, a chaos run at c=32 priced a busy
    # server seconds dearer than it was and split the batch: a probe waited 6x).
    if batch > 0 and profile.source != "prior":
        likely = learned.traffic.coming(dict(here.mix))
        arrivals = batch * min(1.0, out / learned.traffic.mean_output(likely))
        prefills = arrivals * _prefill_of(me, learned.traffic.mean_prompt(likely)) * slowdown
    alone = ttft + steps * step + prefills
    queue = _queued(here, n) * alone
    e2e = queue + alone
    # What it adds to the requests in flight: each step of its server grows by
    # the larger batch; and while it decodes, each busy neighbour's requests run
    # at 1/beside of their speed. An idle server starts that for this request's
    # whole decode; a busy one already slows them and extends it by about half.
    grown = batch * (step - me.step.at(batch) * drift * slowdown) if batch > 0 else 0.0
    extends = 1.0 if batch == 0 else 1.0 - _OVERLAP_SHARE
    slowed = sum(s.load * (1.0 - 1.0 / o.slowdown(1)) for s, o in busy) * extends
    added = _OVERLAP_SHARE * steps * (grown + slowed * step)
    fail = learned.failure(route, f.workload)
    retry = 0.0
    if fail > 0 and others:  # a failed answer costs its time, then one elsewhere
        retry = min(
            (
                o.ttft.at(f.prompt_tokens)
                + max(out - 1, 0)
                / _tau(o, learned.rate(r, f), _drafts(o, schedules.get(r, ()), s.load + n))
                * o.step.at(s.load + n)
            )
            * o.slowdown(len(_busy_beside(profile, state, r)))
            for r, s, o in others
        )
    return Prediction(e2e, e2e + added + fail * retry, tau, steps, queue + ttft, drafts)


def _busy_beside(
    profile: EngineProfile, state: LiveState, route: Route
) -> list[tuple[BackendState, RouteProfile]]:
    """The other routes of `route`'s device that are busy now: their state and profile."""
    near = profile.neighbours(route.value)
    return [
        (s, route_of(profile, r))
        for r in routes_of(profile)
        if r.value in near and (s := state.of(r)).load > 0
    ]


def _queued(here: BackendState, n: int) -> float:
    """Lives a new request waits before its server decodes it: the queue it reports, or,
    past the most sequences it decodes at once (capacity: vLLM's max_num_seqs), the
    excess, each of its slots freeing about once a life. A server at its capacity
    cannot take one more into its batch, nor grow its step past it: the chaos run's
    saturation (40 streams on a server of 40) was priced as a batch of 41."""
    capacity = here.capacity or math.inf
    serving = max(min(here.running or here.load, capacity), 1.0)
    return max(float(here.waiting or 0), here.load + n - capacity, 0.0) / serving


def followers(
    profile: EngineProfile,
    f: RequestFeatures,
    state: LiveState,
    predicted: Mapping[Route, Prediction],
    learned: Learned,
    schedules: Mapping[Route, Schedule] = STATIC,
) -> dict[Route, float]:
    """What the requests that follow this one pay for where it leads them, over the
    cheapest carrier of its device (s, 0 for that carrier; none off a shared device).

    On a time-sliced device the next arrivals join the batch it starts until the
    device next empties: at load L (Poisson arrivals, M/G/inf) e^L - 1 of them, at
    most the traffic's memory, each paying the mix's time there over the cheapest
    route's (docs/decision.md, "The followers")."""
    traffic = learned.traffic
    out: dict[Route, float] = {}
    for group in profile.devices():
        members = [r for r in predicted if r.value in group]
        if len(members) < 2 or not profile.shared(group):
            continue
        here = sum(state.of(r).load for r in members)
        load = max(traffic.expected_load() - 1.0, float(here))
        follow = min(math.expm1(load), TRAFFIC_MEMORY)
        if follow <= 0:
            continue
        mix: dict[Workload, float] = {f.workload: float(max(f.n, 1))}
        for r in members:
            for workload, count in state.of(r).mix:
                mix[workload] = mix.get(workload, 0.0) + count
        coming = traffic.coming(mix) or mix
        prompt = traffic.mean_prompt(coming) or float(f.prompt_tokens)
        output = traffic.mean_output(coming)
        if traffic.seen <= 0:
            output = max(output, learned.outputs.predict(f))
        batch = max(round(load) + 1, 1)
        life = {
            r: route_of(profile, r).ttft.at(prompt)
            + _carry(profile, r, coming, batch, learned, schedules.get(r, ()))
            * max(output - 1.0, 0.0)
            for r in members
        }
        best = min(life.values())
        out.update({r: follow * (life[r] - best) for r in members})
    return out


def _carry(
    profile: EngineProfile,
    route: Route,
    mix: Mapping[Workload, float],
    total: int,
    learned: Learned,
    schedule: Schedule = (),
) -> float:
    """Seconds per token of each sequence with `route` carrying the whole batch alone,
    the prefill of the prompts that arrive meanwhile included on a measured profile
    (one per request per life); each workload's acceptance at its posterior mean, at the
    K the batch gives (a dynamic route's schedule)."""
    rp = route_of(profile, route)
    drafts = _drafts(rp, schedule, total)
    step = rp.step.at(total) * learned.drift(route)
    # Weighed by the tokens each workload generates: a sequence's decode lasts its
    # tokens / tau steps, so a long answer's acceptance counts for its length.
    weights = learned.traffic.output_weights(mix)
    per_token = 0.0
    for workload, weight in weights.items():
        per_token += weight / _tau(rp, learned.workload_rate(route, workload), drafts)
    decode = step * per_token / sum(weights.values())
    if profile.source == "prior":  # its first-token curve is a guess, as in price
        return decode
    prompt, output = learned.traffic.mean_prompt(mix), learned.traffic.mean_output(mix)
    return decode + total * _prefill_of(rp, prompt) / output
