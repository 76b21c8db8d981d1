"""The emulated engine: one asyncio loop doing continuous batching, step by step.

Each step, like vLLM v1's scheduler, serves the running requests first (one
token each, plus the drafts a request carries in speculative and dynamic mode,
out of a per-step token budget), then prefills prompts in chunks with what is
left of the budget, admitting waiting requests in arrival order while the
batch has room (max_num_seqs) and the KV cache can hold them. The step then
lasts what costs.py says it costs, and at its end every request in it gets its
tokens, as one StepOutput: a speculative step that accepted 2 of 4 drafts gives
one output with 3 tokens' text.

Drafts, as in vLLM: at the end of a step the drafter proposes K drafts for
every request that sampled a token (the last prefill chunk or a decode), and
the next step verifies them. K is num_speculative_tokens in speculative mode
and, in dynamic mode, the schedule's K for the number of requests scheduled in
the proposing step (vLLM's scheduler: `dynamic_sd_lookup[len(num_scheduled_tokens)]`),
so a request verifies in step N the K chosen from step N-1's batch.

Timing is kept on a virtual clock: each step ends `cost` after the previous
one ended, not after the loop woke up, so asyncio's late wake-ups and a busy
machine's stalls are absorbed instead of accumulated, and the calibrated ratios
hold at small time scales. A request that arrives mid-step joins the next step.

Simplification: a request is admitted only when its whole KV footprint fits
(the emulator knows the answer's length in advance), so it never preempts;
vLLM admits on current need and preempts when the cache runs out.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from dataclasses import dataclass, field

from .acceptance import draw_accepted
from .config import EmulatorConfig
from .costs import StepShape, step_seconds
from .gpu.profile import REFERENCE_CONTEXT
from .metrics import FinishedRequest, VllmMetrics
from .textgen import Plan

# A busy machine can stall the loop for a few hundred ms: steps then run back to back
# until the clock is caught up, so the stall does not lengthen the requests in flight.
# Past this much lateness (a suspended process) the clock is reset instead.
_MAX_LAG_S = 1.0


@dataclass(frozen=True)
class StepOutput:
    """What one engine step produced for one request."""

    text: str
    num_tokens: int
    finish_reason: str | None = None
    stop_reason: str | None = None


@dataclass
class SpecRecord:
    """Per-request spec-decode statistics (vLLM's RequestSpecDecodeMetrics)."""

    k: int
    histogram: list[int]
    num_draft_tokens: int = 0
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)

    def observe(self, drafted: int, accepted: int) -> None:
        self.histogram[accepted] += 1
        self.num_draft_tokens += drafted
        self.per_step_accepted.append(accepted)
        self.per_step_drafted.append(drafted)


class Sequence:
    """One request inside the engine: its planned answer and its progress."""

    def __init__(
        self,
        *,
        prompt_tokens: int,
        plan: Plan,
        acceptance: float,
        rng: random.Random,
        max_tokens_param: int | None,
        k: int,
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.plan = plan
        self.acceptance = acceptance
        self.rng = rng
        self.max_tokens_param = max_tokens_param
        self.spec = SpecRecord(k, [0] * (k + 1))
        self.outputs: asyncio.Queue[StepOutput] = asyncio.Queue()
        self.arrival = asyncio.get_running_loop().time()
        self.scheduled_at = 0.0
        self.first_token_at = 0.0
        self.last_token_at = 0.0
        self.prefilled = 0
        self.generated = 0
        self.kv_reserved = 0
        self.drafts = 0  # draft tokens proposed for this request's next decode step
        self.finished = False


@dataclass
class EngineCounts:
    """Totals the admin endpoint reports (aborts included even when not in metrics)."""

    submitted: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    client_aborts: int = 0
    steps_by_k: dict[int, int] = field(default_factory=dict)  # K proposed -> steps (spec modes)


@dataclass
class _Batch:
    decode: list[Sequence]
    prefill: list[tuple[Sequence, int]]
    proposed_k: int = 0  # drafts per request this step proposes for the next

    @property
    def size(self) -> int:
        """Requests scheduled in this step (vLLM's len(num_scheduled_tokens))."""
        return len(self.decode) + len(self.prefill)

    def shape(self) -> StepShape:
        context = (
            sum(s.prompt_tokens + s.generated for s in self.decode) / len(self.decode)
            if self.decode
            else REFERENCE_CONTEXT
        )
        return StepShape(
            len(self.decode),
            sum(chunk for _, chunk in self.prefill),
            sum(seq.drafts for seq in self.decode),
            self.proposed_k,
            context,
        )


class SharedGpu:
    """One GPU that emulated servers share, time-sliced, as two vLLM processes share one.

    Measured on an H200 (gpu/measured/, the pair rows): while two processes both run
    steps, each gets about half of the GPU (each one's step took 1.86-2.17x its time
    alone, whatever the other's step; the two shares added to 0.97-1.02). So this is
    processor sharing: while n servers have a step in progress, each step advances at
    1/n of its own speed; a server alone has the whole GPU. It is not the neighbour's
    step added to one's own: a 5.7 ms step beside a busy 12.9 ms one took 10.7 ms.

    Time here is each engine's modelled clock (engine.py): a step is booked from its
    start with its cost alone, and its end follows from who else was busy meanwhile.
    Only servers in one process can share it (local_stack does; `specroute emulate`
    runs each alone).
    """

    def __init__(self) -> None:
        self._now = 0.0  # the modelled time up to which the shares are settled
        self._work: dict[int, float] = {}  # step id -> seconds of work left, alone
        self._done: dict[int, asyncio.Future[float]] = {}
        self._next_id = 0
        self._timer: asyncio.TimerHandle | None = None

    async def run(self, start: float, cost: float) -> float:
        """Run a step of `cost` seconds (alone) from `start`; return when it ends."""
        loop = asyncio.get_running_loop()
        self._settle(max(start, self._now))
        step = self._next_id
        self._next_id += 1
        self._work[step] = cost
        done: asyncio.Future[float] = loop.create_future()
        self._done[step] = done
        self._settle(self._now)
        self._arm(loop)
        try:
            return await done
        finally:
            if step in self._work:  # cancelled (the server shut down): free its share
                del self._work[step]
                del self._done[step]
                self._arm(loop)

    def _settle(self, until: float) -> None:
        """Advance the shares to `until`, finishing every step whose work runs out."""
        while self._work:
            n = len(self._work)
            least = min(self._work.values())
            if self._now + least * n > until + 1e-12:
                break
            self._now += least * n
            for step in list(self._work):
                self._work[step] -= least
                if self._work[step] <= 1e-12:
                    del self._work[step]
                    done = self._done.pop(step)
                    if not done.done():
                        done.set_result(self._now)
        if self._work and until > self._now:
            share = (until - self._now) / len(self._work)
            for step in self._work:
                self._work[step] -= share
        self._now = max(self._now, until)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake up when the next step ends (its modelled end, on the loop's clock)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._work:
            end = self._now + min(self._work.values()) * len(self._work)
            self._timer = loop.call_at(end, self._wake, loop, end)

    def _wake(self, loop: asyncio.AbstractEventLoop, end: float) -> None:
        self._timer = None
        self._settle(end)
        self._arm(loop)


class Engine:
    """Continuous batching over emulated requests; run() is the engine loop."""

    def __init__(
        self, config: EmulatorConfig, metrics: VllmMetrics, gpu: SharedGpu | None = None
    ) -> None:
        self._c = config
        self._metrics = metrics
        self._gpu = gpu
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._kv_reserved = 0
        self._k_by_batch_size = config.k_by_batch_size()
        self._wake = asyncio.Event()
        self.counts = EngineCounts()

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def kv_usage(self) -> float:
        """Fraction of KV blocks in use, as vllm:kv_cache_usage_perc."""
        block = self._c.kv_block_size
        used = sum(-(-(s.prefilled + s.generated) // block) for s in self._running)
        return used * block / self._c.kv_cache_tokens

    def submit(self, seq: Sequence) -> None:
        """Queue a request; it joins the batch at the next step boundary."""
        self.counts.submitted += 1
        self._waiting.append(seq)
        self._wake.set()

    def abort(self, seq: Sequence) -> None:
        """The client went away: drop the request wherever it is, as vLLM aborts it."""
        if seq.finished:
            return
        if seq in self._waiting:
            self._waiting.remove(seq)
        self.counts.client_aborts += 1
        self._finish(
            seq, "abort", asyncio.get_running_loop().time(), record=self._c.count_client_aborts
        )
        self._publish_gauges()

    def shutdown(self) -> None:
        """Tell every pending request the engine is gone (server shutting down)."""
        for seq in [*self._running, *self._waiting]:
            seq.finished = True
            seq.outputs.put_nowait(StepOutput("", 0, "error"))
        self._running.clear()
        self._waiting.clear()

    async def run(self) -> None:
        """The engine loop: schedule a step, wait out its cost, hand out its tokens."""
        loop = asyncio.get_running_loop()
        clock = loop.time()
        while True:
            batch = self._schedule(loop.time())
            if not batch.size:
                self._publish_gauges()
                self._wake.clear()
                await self._wake.wait()
                clock = loop.time()
                continue
            clock = max(clock, loop.time() - _MAX_LAG_S)
            cost = step_seconds(self._c, batch.shape())
            if self._gpu is not None:
                clock = await self._gpu.run(clock, cost)
            else:
                clock += cost
            await asyncio.sleep(max(0.0, clock - loop.time()))
            self._apply(batch, loop.time())
            self._publish_gauges()

    def step_at(self, now: float) -> float | None:
        """One step on a modelled clock, no sleeping: scheduled at `now`, applied at
        `now` + its cost (time_scale applied); the cost, or None when idle (simulate.py)."""
        batch = self._schedule(now)
        if not batch.size:
            return None
        cost = step_seconds(self._c, batch.shape())
        self._apply(batch, now + cost)
        self._publish_gauges()
        return cost

    def _schedule(self, now: float) -> _Batch:
        budget = self._c.max_num_batched_tokens
        batch = _Batch([], [])
        for seq in self._running:
            if seq.prefilled == seq.prompt_tokens and budget >= 1 + seq.drafts:
                batch.decode.append(seq)
                budget -= 1 + seq.drafts
        for seq in self._running:
            if seq.prefilled < seq.prompt_tokens and budget > 0:
                chunk = min(seq.prompt_tokens - seq.prefilled, budget)
                batch.prefill.append((seq, chunk))
                budget -= chunk
        while self._waiting and budget > 0 and len(self._running) < self._c.max_num_seqs:
            seq = self._waiting[0]
            block = self._c.kv_block_size
            need = -(
                -(seq.prompt_tokens + len(seq.plan.pieces) + self._c.num_speculative_tokens)
                // block
            )
            if self._kv_reserved + need * block > self._c.kv_cache_tokens:
                break
            self._waiting.popleft()
            seq.kv_reserved = need * block
            self._kv_reserved += seq.kv_reserved
            seq.scheduled_at = now
            self._running.append(seq)
            self._metrics.prefix_queries.inc(seq.prompt_tokens)
            chunk = min(seq.prompt_tokens, budget)
            batch.prefill.append((seq, chunk))
            budget -= chunk
        if batch.size:
            batch.proposed_k = self._k_by_batch_size[batch.size]
        return batch

    def _apply(self, batch: _Batch, now: float) -> None:
        proposed = batch.proposed_k
        tokens = 0
        drafts = draft_tokens = accepted_total = 0
        per_pos = [0] * self._c.num_speculative_tokens
        for seq, chunk in batch.prefill:
            if seq.finished:
                continue
            seq.prefilled += chunk
            tokens += chunk
            if seq.prefilled == seq.prompt_tokens:
                tokens += self._emit(seq, 1, now)
                seq.drafts = proposed  # drafted after its first token, verified next step
        for seq in batch.decode:
            if seq.finished:
                continue
            n = 1
            if seq.drafts:  # K = 0 proposed nothing: no draft, counters untouched (as vLLM)
                accepted = draw_accepted(seq.acceptance, seq.drafts, seq.rng)
                seq.spec.observe(seq.drafts, accepted)
                drafts += 1
                draft_tokens += seq.drafts
                accepted_total += accepted
                for pos in range(accepted):
                    per_pos[pos] += 1
                n += accepted
            seq.drafts = proposed
            tokens += self._emit(seq, n, now)
        if self._c.speculative:
            self.counts.steps_by_k[proposed] = self.counts.steps_by_k.get(proposed, 0) + 1
        self._metrics.iteration_tokens.observe(tokens)
        if self._metrics.spec is not None and drafts:
            self._metrics.spec.observe(drafts, draft_tokens, accepted_total, per_pos)

    def _emit(self, seq: Sequence, n: int, now: float) -> int:
        pieces = seq.plan.pieces
        n = min(n, len(pieces) - seq.generated)
        text = "".join(pieces[seq.generated : seq.generated + n])
        seq.generated += n
        if seq.first_token_at == 0.0:
            seq.first_token_at = now
            self._metrics.ttft.observe(now - seq.arrival)
            self._metrics.prompt_tokens.inc(seq.prompt_tokens)
        else:
            self._metrics.itl.observe(now - seq.last_token_at)
        seq.last_token_at = now
        self._metrics.generation_tokens.inc(n)
        if seq.generated < len(pieces):
            seq.outputs.put_nowait(StepOutput(text, n))
        else:
            seq.outputs.put_nowait(
                StepOutput(text, n, seq.plan.finish_reason, seq.plan.stop_reason)
            )
            self._finish(seq, seq.plan.finish_reason, now, record=True)
        return n

    def _finish(self, seq: Sequence, reason: str, now: float, *, record: bool) -> None:
        seq.finished = True
        if seq in self._running:
            self._running.remove(seq)
            self._kv_reserved -= seq.kv_reserved
        self.counts.finished[reason] = self.counts.finished.get(reason, 0) + 1
        if not record:
            return
        first = seq.first_token_at or now
        self._metrics.finished(
            FinishedRequest(
                finish_reason=reason,
                e2e_s=now - seq.arrival,
                queued_s=(seq.scheduled_at or now) - seq.arrival,
                prefill_s=first - (seq.scheduled_at or now),
                decode_s=(seq.last_token_at or now) - first,
                inference_s=(seq.last_token_at or now) - (seq.scheduled_at or now),
                prompt_tokens=seq.prompt_tokens,
                generation_tokens=seq.generated,
                max_tokens_param=seq.max_tokens_param,
            )
        )

    def _publish_gauges(self) -> None:
        self._metrics.running.set(len(self._running))
        self._metrics.waiting.set(len(self._waiting))
        self._metrics.kv_usage.set(self.kv_usage())
