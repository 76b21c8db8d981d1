"""Features + live backend state -> Decision(route, reason).

A policy is a small object (RouteLLM's router shape) with no I/O and no clock:
decide() reads and never writes, and its only randomness is the caller's rng (a
Thompson draw), so the same inputs and rng state give the same decision, and every
decision says why in a short, low-cardinality reason (a metric label). What it
learns it learns in learn() and the other learning hooks, from the gateway's
measurements; it is not pure in the sense of stateless.

A host with N GPUs runs N pairs (a speculative and a baseline server on each
GPU). The gateway picks the pair first and hands the policy that pair's
LiveState and its index (`pair`, 0 .. N-1; 0 for a single pair). The profiled
policy keeps one profile and one set of beliefs for all pairs (the pairs run the
same model and configuration); each FinishedRequest names the pair its decision
was made for.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from classifier.features import FeatureOptions, RequestFeatures, Workload

__all__ = [
    "BackendState",
    "Decision",
    "FinishedRequest",
    "GuardsConfig",
    "LiveState",
    "Policy",
    "Route",
    "RulesConfig",
    "RulesPolicy",
    "StaticPolicy",
]


class Route(StrEnum):
    SPECULATIVE = "speculative"
    BASELINE = "baseline"

    @property
    def other(self) -> Route:
        return Route.BASELINE if self is Route.SPECULATIVE else Route.SPECULATIVE


@dataclass(frozen=True, slots=True)
class BackendState:
    inflight: int = 0  # the gateway's own in-flight count for that backend
    healthy: bool = True
    running: int | None = None  # scraped vllm:num_requests_running (None = unknown)
    waiting: int | None = None  # scraped vllm:num_requests_waiting
    kv_cache_usage: float | None = None  # scraped vllm:kv_cache_usage_perc, 0..1
    # Prompt tokens of the gateway's streamed requests there that have no first
    # token yet: a new request's prefill queues behind them (chunked prefill
    # serves prompts in arrival order). Non-streamed requests are not counted
    # (their first token is not seen), so this is a lower bound.
    prefill_tokens: int = 0
    # Requests there that the gateway did not send (other clients), as of the last
    # scrape: the server's running + waiting then, less the gateway's in-flight
    # count then. None: not known that way (a bare snapshot).
    others: int | None = None
    # The gateway's requests in flight there, per workload (the carrier rule's mix).
    mix: tuple[tuple[Workload, int], ...] = ()
    # The gateway's newest request there, numbered across all backends (0: none):
    # the server a busy GPU's batch is heading to, while the other still drains.
    last_start: int = 0

    @property
    def load(self) -> int:
        """Requests in flight there: the gateway's own (exact, live) plus other clients'.

        Without `others`, the gateway's count or the server's running, the higher.
        The server's count alone is a scrape old: it said 2 running on a server the
        gateway had just seen finish both, and the cost model sent creative text
        to the speculative server because the baseline "had" a batch.
        """
        if self.others is not None:
            return self.inflight + self.others
        return max(self.inflight, self.running or 0)


@dataclass(frozen=True, slots=True)
class LiveState:
    speculative: BackendState
    baseline: BackendState

    def of(self, route: Route) -> BackendState:
        return self.speculative if route is Route.SPECULATIVE else self.baseline


@dataclass(frozen=True, slots=True)
class Decision:
    route: Route
    reason: str
    predicted_s: Mapping[Route, float] | None = None  # filled by the cost model
    # Why, for the request's log line and /decide: the predictions' parts, the
    # acceptance used and the rule that decided (the profiled policy fills it).
    why: Mapping[str, object] | None = None


class FinishedRequest(Protocol):
    """One finished, successful request, as the gateway measured it: what a policy learns from."""

    @property
    def route(self) -> Route: ...  # the route that answered
    @property
    def features(self) -> RequestFeatures: ...
    @property
    def state(self) -> LiveState: ...  # the snapshot the decision was made from
    @property
    def ttft_s(self) -> float | None: ...  # streamed only
    @property
    def duration_s(self) -> float: ...
    @property
    def prompt_tokens(self) -> int | None: ...  # the backend's usage
    @property
    def completion_tokens(self) -> int: ...
    @property
    def acceptance(self) -> float | None: ...  # accepted drafts per step / k, speculative only
    @property
    def predicted_s(self) -> float | None: ...  # the prediction for the route that answered
    @property
    def pair(self) -> int: ...  # the pair its decision was made for (its `state`'s)


class Policy(Protocol):
    def decide(
        self,
        features: RequestFeatures,
        state: LiveState,
        pair: int = 0,
        rng: random.Random | None = None,
    ) -> Decision:
        """The route within `pair`, whose endpoints `state` describes; `rng`, the
        caller's, for a policy that explores by drawing (None: no draw)."""
        ...

    def learn(self, outcome: FinishedRequest) -> None: ...

    def estimated_acceptance(self) -> Mapping[Workload, float]:
        """Per-position draft acceptance per workload as believed now (empty: no estimate)."""
        ...

    def shared_gpu(self, pair: int = 0) -> bool | None:
        """Whether the policy routes as if the pair's two servers share one GPU (None: no
        such notion, or not measured yet)."""
        ...


# The speculative batch spared where nothing measured prices it: a rule of thumb, set on
# the emulator's first (unmeasured) GPU, where speculation stopped paying at batch ~35.
UNPRICED_SPEC_MAX_INFLIGHT = 16


@dataclass(frozen=True, slots=True)
class GuardsConfig:
    """When the speculative server is spared, whatever the policy: there a draft costs
    every request on that server (KV per step, compute a big batch no longer has).

    The batch limit, unset, is the policy's: a policy with a measured step curve prices a
    big batch itself (on the measured H200 the 1B draft still pays on structured output
    at batch ~128, where a fixed 16 split one GPU's batch over both servers: c=32,
    docs/benchmarks.md), and one without (the rules, the profiled policy on its
    built-in prior) spares the server at UNPRICED_SPEC_MAX_INFLIGHT."""

    spec_max_inflight: int | None = None  # speculative load (BackendState.load) at/above this
    spec_max_kv_usage: float = 0.9  # speculative KV cache usage at/above this

    def __post_init__(self) -> None:
        if self.spec_max_inflight is not None and self.spec_max_inflight < 1:
            raise ValueError(f"spec_max_inflight must be >= 1, got {self.spec_max_inflight}")
        if not 0.0 < self.spec_max_kv_usage <= 1.0:
            raise ValueError(
                f"spec_max_kv_usage must be within (0, 1], got {self.spec_max_kv_usage}"
            )

    def max_inflight(self, *, batch_priced: bool = False) -> int | None:
        """The speculative batch that is spared: as configured, else none for a policy
        whose measured step curve prices the batch, else UNPRICED_SPEC_MAX_INFLIGHT."""
        if self.spec_max_inflight is not None:
            return self.spec_max_inflight
        return None if batch_priced else UNPRICED_SPEC_MAX_INFLIGHT

    def reason(self, spec: BackendState, *, batch_priced: bool = False) -> str | None:
        """The reason to spare the speculative server now (kv-pressure, spec-busy), or None."""
        if spec.kv_cache_usage is not None and spec.kv_cache_usage >= self.spec_max_kv_usage:
            return "kv-pressure"
        limit = self.max_inflight(batch_priced=batch_priced)
        if limit is not None and spec.load >= limit:
            return "spec-busy"
        return None


DEFAULT_GUARDS = GuardsConfig()
_DEFAULT_FEATURES = FeatureOptions()


@dataclass(frozen=True, slots=True)
class RulesConfig:
    structured_max_temperature: float = 0.3
    prefill_ratio: float = 8.0  # prompt/expected output tokens above this -> baseline
    default_route: Route = Route.SPECULATIVE


class RulesPolicy:
    """The seed's checklist; the first rule that applies decides.

    1. kv-pressure: the speculative server's KV cache is nearly full (a draft
       adds KV per step; preemption there costs more than speculation saves).
    2. spec-busy: the speculative server runs spec_max_inflight (unset:
       UNPRICED_SPEC_MAX_INFLIGHT, the rules price no batch) or more requests
       (the gateway's count or its own, whichever is higher): a big batch
       leaves no spare compute for the draft. 1-2 are the GuardsConfig.
    3. high-temperature: a creative request (explicit temperature at/above
       features.creative_min_temperature, see extract_features) or any request
       sampling above it. A temperature merely inherited from a 1.0 default is not
       "high": at T=1 the target samples its own distribution, which the
       draft imitates.
    4. prefill-bound: prompt_tokens / expected_output_tokens > prefill_ratio;
       prefill is the same on both routes, so speculation has little to win.
       It comes before the content rules: a structured request with a 6k
       prompt and max_tokens 16 is still prefill-bound.
    5. structured-low-temp, 6. code-low-temp: structured output or code at
       temperature <= structured_max_temperature: drafts are accepted often.
    7. default: config.default_route.
    Finally, if the chosen backend is unhealthy and the other is healthy, the
    other answers ("unhealthy-fallback"); with both down the choice stands.
    """

    __slots__ = ("_config", "_creative", "_guards")

    def __init__(
        self,
        config: RulesConfig,
        *,
        guards: GuardsConfig = DEFAULT_GUARDS,
        features: FeatureOptions = _DEFAULT_FEATURES,
    ) -> None:
        self._config = config
        self._guards = guards
        self._creative = features.creative_min_temperature  # the one extract_features used

    @property
    def config(self) -> RulesConfig:
        return self._config

    def decide(
        self,
        features: RequestFeatures,
        state: LiveState,
        pair: int = 0,
        rng: random.Random | None = None,
    ) -> Decision:
        route, reason = self._rules(features, state.speculative)
        if not state.of(route).healthy and state.of(route.other).healthy:
            return Decision(route.other, "unhealthy-fallback")
        return Decision(route, reason)

    def learn(self, outcome: FinishedRequest) -> None:
        """The rules do not learn."""

    def estimated_acceptance(self) -> Mapping[Workload, float]:
        return {}

    def shared_gpu(self, pair: int = 0) -> bool | None:
        return None

    def _rules(self, f: RequestFeatures, spec: BackendState) -> tuple[Route, str]:
        cfg = self._config
        if (guard := self._guards.reason(spec)) is not None:
            return Route.BASELINE, guard
        if f.workload is Workload.CREATIVE or f.temperature > self._creative:
            return Route.BASELINE, "high-temperature"
        if f.prompt_tokens > cfg.prefill_ratio * max(1, f.expected_output_tokens):
            return Route.BASELINE, "prefill-bound"
        low_temp = f.temperature <= cfg.structured_max_temperature
        if f.structured and low_temp:
            return Route.SPECULATIVE, "structured-low-temp"
        if f.code_like and low_temp:
            return Route.SPECULATIVE, "code-low-temp"
        return cfg.default_route, "default"


class StaticPolicy:
    """Always the same route: the trivial baseline router to compare against."""

    __slots__ = ("_route",)

    def __init__(self, route: Route) -> None:
        self._route = route

    def decide(
        self,
        features: RequestFeatures,
        state: LiveState,
        pair: int = 0,
        rng: random.Random | None = None,
    ) -> Decision:
        return Decision(self._route, "static")

    def learn(self, outcome: FinishedRequest) -> None:
        """A fixed route has nothing to learn."""

    def estimated_acceptance(self) -> Mapping[Workload, float]:
        return {}

    def shared_gpu(self, pair: int = 0) -> bool | None:
        return None
