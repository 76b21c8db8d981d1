"""The engine on its modelled clock alone: closed-loop runs with no sleeping and no HTTP.

The same scheduler, step costs and acceptance draws as a served emulator
(engine.py, costs.py, acceptance.py), but time is only the sum of the modelled
step costs, so a run is exact, reproducible and takes milliseconds whatever
the machine is doing. Used to compare engine kinds (baseline, speculative,
dynamic) at a given concurrency without the noise of wall clocks, by the tests
and by anyone asking "what would K per batch size do here".

Closed loop: `concurrency` requests in flight; when one finishes, the next
request arrives at that moment and joins the next step.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections import deque
from dataclasses import dataclass, replace

from .config import EmulatorConfig
from .engine import Engine, Sequence
from .metrics import VllmMetrics
from .textgen import Plan


@dataclass(frozen=True)
class SimRequest:
    """One request as the engine sees it: prompt and answer lengths, draft acceptance."""

    prompt_tokens: int
    output_tokens: int
    acceptance: float


@dataclass(frozen=True)
class SimResult:
    """Modelled seconds (time_scale 1): each request's e2e, in request order, and the run's."""

    e2e_s: tuple[float, ...]
    makespan_s: float
    steps_by_k: dict[int, int]
    draft_tokens: int
    accepted_tokens: int

    @property
    def mean_e2e_s(self) -> float:
        return statistics.fmean(self.e2e_s)


async def closed_loop(
    config: EmulatorConfig, requests: list[SimRequest], concurrency: int
) -> SimResult:
    """Run `requests` through one engine at `concurrency`, on the modelled clock."""
    if concurrency < 1 or not requests:
        raise ValueError("need concurrency >= 1 and at least one request")
    config = replace(config, time_scale=1.0)
    engine = Engine(config, VllmMetrics(config))
    queue = deque(enumerate(requests))
    in_flight: dict[int, Sequence] = {}
    e2e: dict[int, float] = {}
    drafted = accepted = 0
    now = 0.0
    while queue or in_flight:
        while queue and len(in_flight) < concurrency:
            index, request = queue.popleft()
            seq = _sequence(config, index, request)
            seq.arrival = now
            in_flight[index] = seq
            engine.submit(seq)
        cost = engine.step_at(now)
        if cost is None:
            raise RuntimeError("engine idle with requests in flight (a request cannot fit)")
        now += cost
        for index, seq in list(in_flight.items()):
            if seq.finished:
                e2e[index] = seq.last_token_at - seq.arrival
                drafted += seq.spec.num_draft_tokens
                accepted += sum(seq.spec.per_step_accepted)
                del in_flight[index]
    return SimResult(
        e2e_s=tuple(e2e[i] for i in range(len(requests))),
        makespan_s=now,
        steps_by_k=dict(engine.counts.steps_by_k),
        draft_tokens=drafted,
        accepted_tokens=accepted,
    )


def _sequence(config: EmulatorConfig, index: int, request: SimRequest) -> Sequence:
    plan = Plan(("x",) * request.output_tokens, "length")
    rng = random.Random(f"{config.seed}|sim|{index}")
    return Sequence(
        prompt_tokens=request.prompt_tokens,
        plan=plan,
        acceptance=request.acceptance,
        rng=rng,
        max_tokens_param=request.output_tokens,
        k=config.num_speculative_tokens,
    )


def run(config: EmulatorConfig, requests: list[SimRequest], concurrency: int) -> SimResult:
    """closed_loop from synchronous code (the engine's Sequence wants an event loop)."""
    return asyncio.run(closed_loop(config, requests, concurrency))
