"""CostModelPolicy: send each request where its predicted latency is smaller.

    predicted(route) = LatencyModel(route, RouteLoad(prompt tokens, expected
                       output tokens, batch on that backend, waiting there,
                       tokens per step = 1 | tokens_per_step(a, k), ...))

with a from the AcceptanceEstimator and the output length from the
OutputLengthModel; all three learn from each finished request the gateway
hands to learn(). Order of a decision:

1. guards (GuardsConfig), explicit and first: the speculative server's KV
   cache nearly full ("kv-pressure") or its batch at the limit ("spec-busy")
   -> baseline, as in RulesPolicy. These are the cases where speculation can
   hurt everyone on that server, so they are not left to a model that might
   be wrong.
2. both servers on one busy GPU (shared_gpu, and a request in flight on
   either): the whole batch belongs on one server, the ConsolidationTarget
   ("consolidate"). The idle one is never woken for a single request: its
   steps would slow every request in flight by more than the model can be
   sure that request gains. While the other server still holds requests,
   nothing goes there: it drains.
3. otherwise (an idle GPU, or servers on separate GPUs) the smaller
   prediction: "spec-predicted-faster" / "baseline-predicted-faster".
4. exploration: with probability explore_share (more for a workload whose
   acceptance has few measurements, when the slower route is speculative;
   more while the baseline's latency fit is mostly borrowed from the
   speculative one's, when it is the baseline and the GPU has mostly been
   idle of late), and never beyond explore_share of all decisions so far
   (plus a burst of 5), the predicted-slower route instead ("explore").
   Only where safe: not under a guard, both backends healthy, the slower
   route predicted at most explore_max_slowdown times the faster, and (one
   GPU) only while it is idle, since waking the other server under load slows
   every request in flight. Without it a workload whose prior says
   "baseline" would never show its acceptance.
5. avoid-queue: requests wait in the chosen server's queue (scraped
   num_requests_waiting) while the other has room (no queue, no guard): the
   other answers. No wish to keep a batch together is worth a queue.
6. unhealthy fallback, as RulesPolicy.

Per GPU pair (`pair` of decide, and of each finished request: a host with N
GPUs runs a speculative and a baseline server on each) the policy keeps what
belongs to one GPU: the consolidation target, the topology verdict and the
batch's lean. What the pairs have in common (the same model on the same class
of hardware) is learned once from all of them: acceptance, latency fits,
output lengths, the exploration budget, and the consolidation's measurements
per load (classifier/consolidation.py says why).

Randomness comes only from the policy's own random.Random(seed), so the same
seed and the same calls give the same decisions. Not thread-safe: the gateway
calls decide and learn from its one event loop.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Literal

from classifier.acceptance import AcceptanceEstimator, AcceptancePriors
from classifier.acceptance_model import AcceptanceModel
from classifier.consolidation import ConsolidationTarget, LoadMeasurements
from classifier.features import RequestFeatures, Workload
from classifier.latency import LatencyModel, LatencyParameters, LatencyPriors, RouteLoad
from classifier.output_length import OutputLengthModel
from classifier.policy import (
    DEFAULT_GUARDS,
    BackendState,
    Decision,
    FinishedRequest,
    GuardsConfig,
    LiveState,
    Route,
)
from classifier.router import PredictionErrors
from classifier.speculation import expected_tokens_per_step
from classifier.topology import TopologyDetector

__all__ = [
    "COST_MODEL_REASONS",
    "CostModelConfig",
    "CostModelPolicy",
    "Observation",
    "PredictionErrors",
    "send_batch",
]

SPEC, BASE = Route.SPECULATIVE, Route.BASELINE
COST_MODEL_REASONS = (
    "kv-pressure",
    "spec-busy",
    "spec-predicted-faster",
    "baseline-predicted-faster",
    "consolidate",
    "topology-probe",
    "avoid-queue",
    "explore",
    "unhealthy-fallback",
)
_FASTER = {SPEC: "spec-predicted-faster", BASE: "baseline-predicted-faster"}
# A request whose answer has fewer decode steps than this measures its
# acceptance coarsely; it counts proportionally less.
_FULL_WEIGHT_TOKENS = 32.0
# Exploration is a random draw per decision, so its share is explore_share on
# average; this slack over the exact share makes the bound hard without
# throwing away draws that are merely early (a bound at exactly share x n
# would block most of them and explore half as often as configured).
_EXPLORE_BURST = 5
# A workload with no acceptance measured yet is explored at up to _EXPLORE_FULL
# times explore_share (at most _EXPLORE_MAX_SHARE), falling back to the plain
# share as its measurements reach _EXPLORE_FULL; the hard bound above holds.
_EXPLORE_FULL = 20.0
_EXPLORE_MAX_SHARE = 0.5
_BUSY_DECISIONS = 8.0  # the window of _Pair.busy
_ERROR_DECAY = 0.98  # prediction error EWMA: about the last 50 requests


@dataclass(frozen=True, slots=True)
class CostModelConfig:
    num_speculative_tokens: int = 4  # k, from the speculative server's --speculative-config
    draft_cost_ratio: float = 0.1  # c: one draft pass / one target step
    explore_share: float = 0.03
    # A workload's next N decisions after a shadow copy of it was learned explore
    # no user: the copy measured the route not taken in idle time, at no user's
    # expense (0: copies never replace exploration). At a 5% shadow share, 64 is
    # about three copies' worth.
    shadow_cover_decisions: int = 64
    explore_max_slowdown: float = 2.0  # never explore a route predicted slower than this x
    seed: int = 0
    # Both servers on one GPU (the usual deployment): while the other server is
    # busy, each step of one also waits for a step of the other. "auto": measure
    # it (classifier/topology.py), assuming one GPU until measured.
    shared_gpu: bool | Literal["auto"] = "auto"
    # Route on the total latency a choice causes (this request's plus what it
    # adds to the requests in flight), not on this request's alone.
    account_for_others: bool = True
    # One GPU under load: the batch moves to the other server only when its
    # measured latency per unit of work at this load is this much smaller.
    consolidate_margin: float = 0.05
    latency: LatencyPriors = field(default_factory=LatencyPriors)
    acceptance: AcceptancePriors = field(default_factory=AcceptancePriors)

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1 or not self.draft_cost_ratio >= 0:
            raise ValueError("cost model: need num_speculative_tokens >= 1, draft_cost_ratio >= 0")
        if self.shared_gpu not in (True, False, "auto"):
            raise ValueError('cost model: shared_gpu must be true, false or "auto"')
        if not 0.0 <= self.consolidate_margin < 1.0:
            raise ValueError("cost model: need 0 <= consolidate_margin < 1")
        if self.shadow_cover_decisions < 0:
            raise ValueError("cost model: need shadow_cover_decisions >= 0")
        if not 0.0 <= self.explore_share <= 0.5 or not self.explore_max_slowdown >= 1.0:
            raise ValueError(
                "cost model: need 0 <= explore_share <= 0.5, explore_max_slowdown >= 1"
            )


@dataclass(frozen=True, slots=True)
class Observation:
    """One finished, successful request, with the load it met (learn builds it).

    prompt_tokens is kept for logs; the fit uses features.prompt_tokens, the
    gateway's own count, because that is what every prediction is made from
    (the backend's tokenizer and chat template differ from tiktoken's, and a
    fit on one count applied to the other would be off by their ratio).
    """

    route: Route
    features: RequestFeatures
    batch: int  # requests in flight on that backend when this one was sent (incl. itself)
    waiting: int | None  # scraped waiting count at send time, if known
    ttft_s: float | None  # streamed only
    duration_s: float
    prompt_tokens: int  # as reported by the backend's usage
    completion_tokens: int
    acceptance: float | None  # accepted/draft tokens of this request (speculative route only)
    predicted_s: float | None  # what the policy predicted for the route taken
    # The other server's in-flight count at send time, as the gateway counts it
    # (exact and live; a scraped `running` can be a scrape interval old, and an
    # idle neighbour counted busy would be charged for steps it never ran).
    other_batch: int = 0
    prefill_ahead: int = 0  # BackendState.prefill_tokens of its route at send time
    pair: int = 0  # the GPU pair it was decided for (its batch and other_batch are that pair's)


def _queued(backend: BackendState) -> bool:
    """A real queue at the server (vLLM's num_requests_waiting above its running
    count): a new request would wait behind it, which no wish to keep the batch
    together outweighs. A few waiting beside a busy batch are requests that arrived
    mid-step or behind a chunked prefill (38% of scrapes at concurrency 8 on the
    emulator): sending those away split the batch and cost 20-33% under load."""
    return (backend.waiting or 0) > max(backend.running or 0, 1)


def send_batch(state: LiveState, route: Route, n: int = 1) -> int:
    """The batch a request joins: its backend's load (ours or its own, the higher) plus it.

    learn fills Observation.batch with this, from the snapshot decide was given,
    so the model learns on the quantity it predicts with.
    """
    return state.of(route).load + max(n, 1)


@dataclass(slots=True)
class _Pair:
    """What one GPU's pair of servers has of its own: the server its batch runs on,
    whether the two share the GPU, and which server its batch in flight leans to."""

    consolidation: ConsolidationTarget
    topology: TopologyDetector
    lean: float = 0.0  # running mean of log(spec / base) predicted for its batch
    # Share of recent decisions (about the last 8) that found its GPU busy: an
    # idle moment in traffic that is mostly busy is a gap inside a burst.
    busy: float = 0.0

    @property
    def shared(self) -> bool:
        """One GPU, as set or measured; assumed until measured (the deployment in deploy/)."""
        shared = self.topology.shared
        return True if shared is None else shared


class CostModelPolicy:
    """Predicted-latency routing with guards, bounded exploration and online learning."""

    __slots__ = (
        "_acceptance",
        "_config",
        "_decisions",
        "_error_totals",
        "_errors",
        "_explored",
        "_guards",
        "_latency",
        "_load_measurements",
        "_outputs",
        "_pairs",
        "_rng",
        "_shadowed",
        "_tps_k",
        "_unit",
    )

    def __init__(
        self,
        config: CostModelConfig,
        model: AcceptanceModel | None = None,
        *,
        guards: GuardsConfig = DEFAULT_GUARDS,
    ) -> None:
        self._config = config
        self._guards = guards
        k = config.num_speculative_tokens
        self._tps_k = k
        self._latency = LatencyModel(config.latency, k, config.draft_cost_ratio)
        # The consolidation's unit of work: a request's latency alone on an idle GPU
        # at the PRIOR rates, which never move, so measurements taken hours
        # apart (one route's before the other's) stay comparable.
        self._unit = LatencyModel(config.latency, k, config.draft_cost_ratio)
        self._acceptance = AcceptanceEstimator(config.acceptance, k, model)
        self._outputs = OutputLengthModel()
        self._pairs: dict[int, _Pair] = {}  # made at a pair's first decision or lesson
        self._load_measurements = LoadMeasurements()  # every pair's consolidation judges on it
        self._rng = random.Random(config.seed)
        self._decisions = 0
        self._explored = 0
        self._errors: dict[Route, float] = {}
        self._error_totals: dict[Route, PredictionErrors] = {}
        # Per workload: decisions so far, and that count at its last shadow copy.
        self._shadowed: dict[Workload, tuple[int, int | None]] = {}

    @property
    def config(self) -> CostModelConfig:
        return self._config

    def predict(self, f: RequestFeatures, state: LiveState, pair: int = 0) -> dict[Route, float]:
        """Predicted seconds, send to last byte, on each route of `pair` for this request now."""
        return self._predict(self._loads(f, state, self._pair(pair).shared))

    def _pair(self, pair: int) -> _Pair:
        """The state of one GPU pair, made fresh at its first use."""
        if (known := self._pairs.get(pair)) is not None:
            return known
        if pair < 0:
            raise ValueError(f"cost model: pair must be >= 0, got {pair}")
        made = _Pair(
            ConsolidationTarget(
                self._config.consolidate_margin, measurements=self._load_measurements
            ),
            TopologyDetector(self._config.shared_gpu),
        )
        self._pairs[pair] = made
        return made

    def _loads(self, f: RequestFeatures, state: LiveState, shared: bool) -> dict[Route, RouteLoad]:
        """What each route's prediction and cost need, computed once per decision."""
        out = self._outputs.predict(f)
        tps = expected_tokens_per_step(self._acceptance.predict(f), self._tps_k)
        return {
            route: RouteLoad(
                prompt_tokens=f.prompt_tokens,
                output_tokens=out,
                batch=send_batch(state, route, f.n),
                waiting=state.of(route).waiting or 0,
                tokens_per_step=tps if route is SPEC else 1.0,
                other_batch=state.of(route.other).inflight if shared else 0,
                prefill_ahead=state.of(route).prefill_tokens,
            )
            for route in (SPEC, BASE)
        }

    def _predict(self, loads: dict[Route, RouteLoad]) -> dict[Route, float]:
        return {route: self._latency.predict(route, load) for route, load in loads.items()}

    def shared_gpu(self, pair: int = 0) -> bool | None:
        """One GPU (True) or a GPU each (False) for that pair, as set or measured; None
        while measuring."""
        return self._pair(pair).topology.shared

    def topology(self, pair: int = 0) -> tuple[bool | None, float | None, int]:
        """That pair's (shared: None while measuring; the evidence, 0 alone .. 1 shared;
        probes sent)."""
        topology = self._pair(pair).topology
        return topology.shared, topology.evidence(), topology.probes

    def decide(
        self,
        features: RequestFeatures,
        state: LiveState,
        pair: int = 0,
        rng: random.Random | None = None,
    ) -> Decision:
        """The route within `pair` (a GPU's two servers), whose endpoints `state` describes."""
        self._decisions += 1
        covered = self.shadow_covered(features.workload)
        seen, last = self._shadowed.get(features.workload, (0, None))
        self._shadowed[features.workload] = (seen + 1, last)
        gpu = self._pair(pair)
        loads = self._loads(features, state, gpu.shared)
        predicted = self._predict(loads)
        inflight = {SPEC: state.speculative.inflight, BASE: state.baseline.inflight}
        gpu_busy = gpu.shared and (inflight[SPEC] > 0 or inflight[BASE] > 0)
        gpu.busy += (float(gpu_busy) - gpu.busy) / _BUSY_DECISIONS
        if (guard := self._guards.reason(state.speculative)) is not None:
            route, reason = BASE, guard
        elif gpu_busy:
            lean = self._lean(gpu, loads, state, features.n)
            route, reason = self._consolidate(
                gpu.consolidation, inflight, lean, settled=not gpu.topology.measuring
            )
            # A probe tells only beside a batch of 2 or more (the two hypotheses differ).
            testable = inflight[route] >= 2 and self._has_room(route.other, state)
            if testable and gpu.topology.probe_now():
                # What finishes beside it was slowed a little (one of the probe's steps
                # per step, for one request's life, every 25 decisions) and still counts
                # for the carrier. Leaving out the next 2 x batch completions after each
                # probe starved the measurements while the topology was measured (10
                # completions counted in 127 decisions at concurrency 8), so verdicts
                # came late and a ramp followed a server measured on a few short
                # requests: nine one-GPU scenarios at concurrency 8 (virtual time, 8
                # seeds) 1.094x the better static route on average, 1.052x counting
                # them. Leaving out exactly the requests in flight beside a probe gave
                # 1.088x: it is the count of measurements that matters, not the probe's
                # slowdown in them.
                route, reason = route.other, "topology-probe"
        else:
            cost = self._cost(predicted, loads)
            route = SPEC if cost[SPEC] < cost[BASE] else BASE
            reason = _FASTER[route]
            # Measuring the baseline's latency is worth a user's request where the
            # GPU is mostly idle; at the start of a burst that request would start
            # the batch on the route predicted slower, or split it.
            mostly_idle = gpu.busy < 0.5
            if self._explore(features, route.other, predicted, state, covered, mostly_idle):
                route, reason = route.other, "explore"
        if _queued(state.of(route)) and self._has_room(route.other, state, busy_ok=True):
            route, reason = route.other, "avoid-queue"
        if not state.of(route).healthy and state.of(route.other).healthy:
            return Decision(route.other, "unhealthy-fallback", predicted)
        return Decision(route, reason, predicted)

    def _has_room(self, route: Route, state: LiveState, *, busy_ok: bool = False) -> bool:
        """No queue there, and (speculative) no guard: a request would start at once.

        busy_ok: a big speculative batch still has room, only less gain from
        speculation; against a queue elsewhere that is the better deal (the KV
        guard still holds: a full cache would preempt)."""
        if _queued(state.of(route)) or not state.of(route).healthy:
            return False
        guard = self._guards.reason(state.speculative)
        return route is BASE or guard is None or (busy_ok and guard == "spec-busy")

    def _consolidate(
        self,
        target: ConsolidationTarget,
        inflight: dict[Route, int],
        lean: Route | None,
        *,
        settled: bool,
    ) -> tuple[Route, str]:
        """One GPU with requests in flight: keep the batch on the target server."""
        # The carrier must be able to take the load the GPU has been under, not
        # just the few requests of a ramp after a lull (it would take them, then
        # hand them back at the guard's limit, a split either way).
        total = max(inflight[SPEC] + inflight[BASE] + 1, target.load)
        allowed = frozenset((SPEC, BASE) if total <= self._guards.spec_max_inflight else (BASE,))
        return target.update(inflight, allowed, lean, stray_trials=settled), "consolidate"

    def _lean(
        self, gpu: _Pair, loads: dict[Route, RouteLoad], state: LiveState, n: int
    ) -> Route | None:
        """Which server the cost model predicts faster for the whole batch in flight.

        Each request under load is predicted on both servers as if the whole
        batch (everything in flight, and it) ran there; the running mean of the
        log ratio is the traffic's lean. Consolidation follows it wherever it
        has no measurements yet, instead of a fixed first carrier. The mean runs
        over about as many decisions as there are requests in flight, i.e. over
        the batch itself: over the last 10 decisions, it kept creative text on
        the speculative server through a whole burst after structured output.
        """
        total = state.speculative.load + state.baseline.load + max(n, 1)
        whole = {
            route: self._latency.predict(
                route,
                replace(load, batch=total, waiting=0, other_batch=0, prefill_ahead=0),
            )
            for route, load in loads.items()
        }
        if whole[SPEC] > 0 and whole[BASE] > 0:
            ratio = math.log(whole[SPEC] / whole[BASE])
            gpu.lean += (ratio - gpu.lean) / total
        # Within the margin it is too close to call (None: the carrier stays). Mixed
        # traffic's mean hovers near 0 and, followed by its sign, moved the batch at
        # nearly every decision where nothing was measured yet, each move a drain:
        # once the baseline was explored more at concurrency 1 (so warmed differently),
        # nine one-GPU scenarios at concurrency 8 (virtual time, 4 seeds) came out at
        # 1.150x the better static route on average and 1.57x at worst (c = 0.4); with
        # the margin, 1.096x and 1.17x.
        if abs(gpu.lean) < -math.log(1.0 - self._config.consolidate_margin):
            return None
        return SPEC if gpu.lean < 0 else BASE

    def _cost(
        self, predicted: dict[Route, float], loads: dict[Route, RouteLoad]
    ) -> dict[Route, float]:
        """What a route costs all requests together: this one's latency plus what it adds
        to the others' (the mean latency is what the gateway minimises)."""
        if not self._config.account_for_others:
            return predicted
        return {
            route: predicted[route] + self._latency.slowdown_of_others(route, load)
            for route, load in loads.items()
        }

    def _explore(
        self,
        f: RequestFeatures,
        slower: Route,
        predicted: dict[Route, float],
        state: LiveState,
        covered: bool = False,
        measure_baseline: bool = True,
    ) -> bool:
        cfg = self._config
        faster_s, slower_s = predicted[slower.other], predicted[slower]
        if not (state.speculative.healthy and state.baseline.healthy):
            return False
        if self._explored >= cfg.explore_share * self._decisions + _EXPLORE_BURST:
            return False  # a hard bound, besides the random draw
        if slower_s > cfg.explore_max_slowdown * faster_s:
            return False
        share = cfg.explore_share
        if covered:
            share = 0.0  # a shadow copy explores for the users
        elif slower is SPEC:
            # A workload with few measured acceptances is where the estimate may be
            # wrong (a prior, or traffic that changed): spend the budget there first.
            measured = self._acceptance.count(f.workload)
            share = min(_EXPLORE_MAX_SHARE, share * max(1.0, _EXPLORE_FULL / (measured + 1.0)))
        elif share > 0 and measure_baseline:
            # A baseline the policy has hardly sent to is predicted from the other
            # route's fit through the priors' ratio of the two steps, a guess that
            # kept it 1.5x too slow and unvisited (concurrency 1, every step cost
            # x0.5: 1.164x the oracle, virtual time): measure it, share / its own
            # weight in its fit, at most _EXPLORE_MAX_SHARE (the hard bound holds).
            own = self._latency.own_share(BASE)
            share = min(_EXPLORE_MAX_SHARE, share / max(own, share / _EXPLORE_MAX_SHARE))
        if self._rng.random() >= share:
            return False
        self._explored += 1
        return True

    def learn(self, outcome: FinishedRequest) -> None:
        """Learn from one finished, successful request, at the load its decision saw.

        An answer without tokens (a backend that sent no usage) teaches nothing.
        """
        if outcome.completion_tokens <= 0:
            return
        route, f, state = outcome.route, outcome.features, outcome.state
        prompt = outcome.prompt_tokens
        self.observe(
            Observation(
                route=route,
                features=f,
                batch=send_batch(state, route, f.n),
                waiting=state.of(route).waiting,
                ttft_s=outcome.ttft_s,
                duration_s=outcome.duration_s,
                prompt_tokens=f.prompt_tokens if prompt is None else prompt,
                completion_tokens=outcome.completion_tokens,
                acceptance=outcome.acceptance,
                predicted_s=outcome.predicted_s,
                other_batch=state.of(route.other).inflight,
                prefill_ahead=state.of(route).prefill_tokens,
                pair=outcome.pair,
            )
        )

    def learn_shadow(self, outcome: FinishedRequest) -> None:
        """Learn from a shadow copy's answer (the route a user request was not sent to,
        same request, measured in idle time): as any answer, and its workload counts as
        covered, so its users are not explored for shadow_cover_decisions. Never
        counted as a user exploration."""
        self.learn(outcome)
        w = outcome.features.workload
        seen, _ = self._shadowed.get(w, (0, None))
        self._shadowed[w] = (seen, seen)

    def shadow_covered(self, workload: Workload) -> bool:
        """Its next decision is covered: a shadow copy of this workload was learned
        within its last shadow_cover_decisions decisions."""
        seen, last = self._shadowed.get(workload, (0, None))
        return last is not None and seen - last < self._config.shadow_cover_decisions

    def observe(self, obs: Observation) -> None:
        """Learn from one finished request (call only for successful answers)."""
        if not (math.isfinite(obs.duration_s) and obs.duration_s > 0):
            return
        f = obs.features
        gpu = self._pair(obs.pair)
        per_seq = obs.completion_tokens / max(f.n, 1)
        if obs.route is SPEC:
            if obs.acceptance is not None and per_seq >= 2:
                weight = min(1.0, per_seq / _FULL_WEIGHT_TOKENS)
                self._acceptance.observe(f, obs.acceptance, weight)
            if obs.acceptance is not None and math.isfinite(obs.acceptance):
                tps = 1.0 + self._tps_k * min(max(obs.acceptance, 0.0), 1.0)
            else:
                tps = expected_tokens_per_step(self._acceptance.predict(f), self._tps_k)
        else:
            tps = 1.0
        load = RouteLoad(
            prompt_tokens=f.prompt_tokens,  # the count the prediction uses, not the backend's
            output_tokens=per_seq,
            batch=max(obs.batch, 1),
            waiting=obs.waiting or 0,
            tokens_per_step=tps,
            other_batch=obs.other_batch if gpu.shared else 0,
            prefill_ahead=obs.prefill_ahead,
        )
        if gpu.topology.measuring and obs.batch <= 2 and obs.other_batch >= 2:
            alone = self._latency.predict(obs.route, replace(load, other_batch=0))
            shared = self._latency.predict(obs.route, replace(load, other_batch=obs.other_batch))
            gpu.topology.observe(obs.duration_s, alone, shared)
        if obs.predicted_s is not None and math.isfinite(obs.predicted_s):
            explained = self._latency.predict(obs.route, load)
            self._record_error(obs.route, obs.predicted_s, explained, obs.duration_s)
        self._latency.observe(obs.route, load, duration_s=obs.duration_s, ttft_s=obs.ttft_s)
        self._outputs.observe(f, obs.completion_tokens)
        if gpu.shared and obs.other_batch == 0 and obs.route is gpu.consolidation.route:
            size = self._unit.predict(BASE, RouteLoad(f.prompt_tokens, per_seq, 1.0))
            gpu.consolidation.observed(obs.route, obs.batch, obs.duration_s, size)

    def _record_error(self, route: Route, predicted: float, explained: float, took: float) -> None:
        error = abs(predicted - took) / took
        old = self._errors.get(route)
        self._errors[route] = (
            error if old is None else _ERROR_DECAY * old + (1 - _ERROR_DECAY) * error
        )
        totals = self._error_totals.setdefault(route, PredictionErrors())
        totals.count += 1
        totals.as_sent += error
        totals.given_length += abs(explained - took) / took

    # ---- read-back for metrics and logs --------------------------------------------

    def estimated_acceptance(self) -> dict[Workload, float]:
        """Per-position acceptance a per workload, as the policy currently believes."""
        return self._acceptance.by_workload()

    def acceptance_samples(self) -> dict[Workload, float]:
        return self._acceptance.samples()

    def latency_parameters(self) -> dict[Route, LatencyParameters]:
        return self._latency.parameters()

    def prediction_error(self) -> dict[Route, float]:
        """Recent mean |predicted - measured| / measured per route (routes with data only)."""
        return dict(self._errors)

    def error_totals(self) -> dict[Route, PredictionErrors]:
        """Copies of the running sums behind the MAPE per route (benchmarks diff two reads)."""
        return {r: t.since(None) for r, t in self._error_totals.items()}

    def consolidation_trials(self) -> int:
        """How often a busy GPU's target was switched to try the other server (all pairs)."""
        return sum(gpu.consolidation.trials for gpu in self._pairs.values())

    def carrier(self, pair: int = 0) -> Route:
        """The server that pair's batch goes to while its GPU is busy (its consolidation
        target)."""
        return self._pair(pair).consolidation.route

    def explore_counts(self) -> tuple[int, int]:
        """(explored, decided) since start."""
        return self._explored, self._decisions
