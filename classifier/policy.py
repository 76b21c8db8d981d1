"""Features + live backend state -> Decision(route, reason).

A policy is a small pure object (RouteLLM's router shape): no I/O, no clock,
no randomness, so the same inputs always give the same decision and every
decision says why in a short, low-cardinality reason (a metric label).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from classifier.features import RequestFeatures, Workload

__all__ = [
    "BackendState",
    "Decision",
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

    @property
    def load(self) -> int:
        """Requests in flight there: the gateway's count or the server's own, the higher
        (other clients may use it too; a scrape may be an interval old)."""
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


class Policy(Protocol):
    def decide(self, features: RequestFeatures, state: LiveState) -> Decision: ...


@dataclass(frozen=True, slots=True)
class RulesConfig:
    structured_max_temperature: float = 0.3
    creative_min_temperature: float = 1.0
    prefill_ratio: float = 8.0  # prompt/expected output tokens above this -> baseline
    spec_max_inflight: int = 8  # speculative load at/above this -> baseline
    spec_max_kv_usage: float = 0.9
    default_route: Route = Route.SPECULATIVE


class RulesPolicy:
    """The seed's checklist; the first rule that applies decides.

    1. kv-pressure: the speculative server's KV cache is nearly full (a draft
       adds KV per step; preemption there costs more than speculation saves).
    2. spec-busy: the speculative server runs spec_max_inflight or more
       requests (the gateway's count or its own, whichever is higher): a big
       batch leaves no spare compute for the draft.
    3. high-temperature: a creative request (explicit temperature at/above
       creative_min_temperature, see extract_features) or any request sampling
       above it. A temperature merely inherited from a 1.0 default is not
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

    __slots__ = ("_config",)

    def __init__(self, config: RulesConfig) -> None:
        self._config = config

    @property
    def config(self) -> RulesConfig:
        return self._config

    def decide(self, features: RequestFeatures, state: LiveState) -> Decision:
        route, reason = self._rules(features, state.speculative)
        if not state.of(route).healthy and state.of(route.other).healthy:
            return Decision(route.other, "unhealthy-fallback")
        return Decision(route, reason)

    def _rules(self, f: RequestFeatures, spec: BackendState) -> tuple[Route, str]:
        cfg = self._config
        if spec.kv_cache_usage is not None and spec.kv_cache_usage >= cfg.spec_max_kv_usage:
            return Route.BASELINE, "kv-pressure"
        if spec.load >= cfg.spec_max_inflight:
            return Route.BASELINE, "spec-busy"
        if f.workload is Workload.CREATIVE or f.temperature > cfg.creative_min_temperature:
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

    def decide(self, features: RequestFeatures, state: LiveState) -> Decision:
        return Decision(self._route, "static")
