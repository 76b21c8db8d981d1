"""The gateway measures each server's decode step from that server's own /metrics.

A route the router has not sent to used to be predicted from the other route's
fit through the priors' ratio of the two steps: in the README demo, cold, the
baseline's step at batch 2 came out near 2x what the emulator runs, and creative
text stayed on the speculative server. vLLM's inter-token latency and iteration
histograms measure every server's step whoever sends the traffic; these tests
send it straight to the emulated servers (one shared emulated GPU), as the
demo's and the bench's static runs do, and read what the gateway made of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from classifier.costmodel import CostModelPolicy
from classifier.policy import Route
from classifier.tokens import TokenCounter
from gateway.scraper import Scrape, parse_metrics
from gateway.state import RUNTIME
from tests.gateway.test_observability import samples
from tests.support import wait_until
from tooling.loadgen import run_closed_loop
from tooling.local_stack import MODEL, LocalStack, local_stack
from tooling.workloads import build

TIME_SCALE = 0.25


@pytest.fixture
async def stack(tokens: TokenCounter) -> AsyncIterator[LocalStack]:
    async with local_stack(time_scale=TIME_SCALE, tokens=tokens) as stack:
        yield stack


def policy(stack: LocalStack) -> CostModelPolicy:
    assert stack.gateway_app is not None
    policy = stack.gateway_app[RUNTIME].current.policy
    assert isinstance(policy, CostModelPolicy)
    return policy


def step(stack: LocalStack, route: Route, batch: float) -> float:
    rates = policy(stack).latency_parameters()[route]
    return rates.step_base_s + rates.step_per_seq_s * batch


async def scrape(session: aiohttp.ClientSession, url: str) -> Scrape:
    async with session.get(f"{url}/metrics") as resp:
        return parse_metrics(await resp.text(), 0.0)


async def windows(session: aiohttp.ClientSession, gateway: str, route: str, outcome: str) -> float:
    async with session.get(f"{gateway}/metrics") as resp:
        m = samples(await resp.text())
    key = ("specroute_step_windows_total", (("backend", route), ("outcome", outcome)))
    return m.get(key, 0.0)


async def direct(session: aiohttp.ClientSession, url: str, seed: int) -> None:
    """Twenty-four chat answers straight to one server, two at a time: not via the gateway."""
    results = await run_closed_loop(session, url, build(["chat"], 24, model=MODEL, seed=seed), 2)
    assert all(r.ok for r in results)


async def test_a_server_the_gateway_never_used_is_measured_by_its_own_steps(
    stack: LocalStack,
) -> None:
    async with aiohttp.ClientSession() as session:
        prior = step(stack, Route.BASELINE, 2)
        before = await scrape(session, stack.baseline)
        await direct(session, stack.baseline, seed=1)
        await wait_until(
            lambda: windows(session, stack.gateway, "baseline", "fitted"),
            "a baseline step window fitted",
        )
        await asyncio.sleep(0.6)  # one more scrape: the last steps of the run
        after = await scrape(session, stack.baseline)
        assert before.gaps is not None and after.gaps is not None
        assert before.gap_seconds is not None and after.gap_seconds is not None
        assert before.steps is not None and after.steps is not None
        truth = (after.gap_seconds - before.gap_seconds) / (after.gaps - before.gaps)
        batch = (after.gaps - before.gaps) / (after.steps - before.steps)
        fitted = step(stack, Route.BASELINE, batch)
    # The prior's step is 5x what the emulator runs. Windows of a single batch size
    # move the step rates only as far as their weight beats the fit's pull toward
    # the prior (5 windows of 5 requests' worth against 2): ~1.35x the truth here.
    assert prior > 4 * truth
    assert truth < fitted < 1.5 * truth, (prior, fitted, truth, batch)
    assert policy(stack).latency_parameters()[Route.SPECULATIVE].samples == 0


async def test_steps_taken_while_the_other_server_ran_on_the_gpu_are_not_fitted(
    stack: LocalStack,
) -> None:
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(
            direct(session, stack.baseline, seed=1), direct(session, stack.speculative, seed=2)
        )
        await wait_until(
            lambda: windows(session, stack.gateway, "baseline", "gpu_busy"),
            "a baseline window with the speculative server busy",
        )
        fitted = await windows(session, stack.gateway, "baseline", "fitted")
        busy = await windows(session, stack.gateway, "baseline", "gpu_busy")
    # Windows at the edges (one server already done) may count; the busy ones do not.
    assert busy >= 2 * fitted, (busy, fitted)
