"""The policies without a cost model: the seed's checklist of rules, and one fixed route.

Neither learns: their learning calls are no-ops (Unlearning), so the gateway treats
them as it treats the profiled policy.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from classifier.features import FeatureOptions, RequestFeatures, Workload
from classifier.guards import DEFAULT_GUARDS, GuardsConfig
from classifier.profile import EngineProfile
from classifier.types import (
    TWO_ROUTES,
    BackendState,
    Decision,
    FinishedRequest,
    LiveState,
    Route,
    RouteSpec,
)

__all__ = ["RulesConfig", "RulesPolicy", "StaticPolicy", "Unlearning"]

_DEFAULT_FEATURES = FeatureOptions()


class Unlearning:
    """The learning half of the Policy protocol for a policy with nothing to learn."""

    __slots__ = ()

    def learn(self, outcome: FinishedRequest) -> None:
        """Nothing to learn."""

    def learn_failure(self, route: Route, features: RequestFeatures) -> None:
        """Nothing to learn."""

    def learn_shadow(self, outcome: FinishedRequest) -> None:
        """Nothing to learn."""

    def use_profile(self, profile: EngineProfile) -> None:
        """No profile is used."""

    def load_state(self, raw: object) -> None:
        """Nothing was learned to load."""

    @property
    def wants_profile(self) -> bool:
        return False

    @property
    def profile(self) -> EngineProfile | None:
        return None

    def profile_contradicted(self) -> bool:
        return False

    def drift(self) -> Mapping[Route, float]:
        return {}

    def state_to_json(self) -> dict[str, Any] | None:
        return None

    def estimated_acceptance(self) -> Mapping[Route, Mapping[Workload, float]]:
        return {}

    def shared_gpu(self, pair: int = 0) -> bool | None:
        return None


@dataclass(frozen=True, slots=True)
class RulesConfig:
    structured_max_temperature: float = 0.3
    prefill_ratio: float = 8.0  # prompt/expected output tokens above this -> baseline
    # Where a request no rule sends goes; None: the first speculative route.
    default_route: Route | None = None


class RulesPolicy(Unlearning):
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
    With several routes, "speculative" is the first speculative route configured and
    "baseline" the first without speculation: the rules say whether to speculate, not
    how. Finally, if the chosen backend is unhealthy, the first healthy route in the
    configuration's order answers ("unhealthy-fallback"); with all down the choice
    stands.
    """

    __slots__ = ("_base", "_config", "_creative", "_default", "_guards", "_routes", "_spec")

    def __init__(
        self,
        config: RulesConfig,
        *,
        routes: Sequence[RouteSpec] = TWO_ROUTES,
        guards: GuardsConfig = DEFAULT_GUARDS,
        features: FeatureOptions = _DEFAULT_FEATURES,
    ) -> None:
        spec = next((r.name for r in routes if r.speculative), None)
        base = next((r.name for r in routes if not r.speculative), None)
        if spec is None or base is None:
            raise ValueError("rules: want a speculative route and one without speculation")
        default = config.default_route or spec
        if default not in {r.name for r in routes}:
            raise ValueError(f"rules: default_route {default!r} is not a route")
        self._config = config
        self._guards = guards
        self._routes = tuple(r.name for r in routes)
        self._spec, self._base, self._default = spec, base, default
        self._creative = features.creative_min_temperature  # the one extract_features used

    @property
    def config(self) -> RulesConfig:
        return self._config

    def decide(
        self, features: RequestFeatures, state: LiveState, rng: random.Random | None = None
    ) -> Decision:
        route, reason = self._rules(features, state.of(self._spec), state.of(self._base).load)
        if not state.of(route).healthy:
            healthy = next((r for r in self._routes if state.of(r).healthy), None)
            if healthy is not None:
                return Decision(healthy, "unhealthy-fallback")
        return Decision(route, reason)

    def _rules(self, f: RequestFeatures, spec: BackendState, base_load: int) -> tuple[Route, str]:
        cfg = self._config
        if (guard := self._guards.reason(spec, lightest_other=base_load)) is not None:
            return self._base, guard
        if f.workload is Workload.CREATIVE or f.temperature > self._creative:
            return self._base, "high-temperature"
        # A ratio, not a product: features read max_tokens unbounded (10**400 overflowed).
        if f.prompt_tokens / max(1, f.expected_output_tokens) > cfg.prefill_ratio:
            return self._base, "prefill-bound"
        low_temp = f.temperature <= cfg.structured_max_temperature
        if f.structured and low_temp:
            return self._spec, "structured-low-temp"
        if f.code_like and low_temp:
            return self._spec, "code-low-temp"
        return self._default, "default"


class StaticPolicy(Unlearning):
    """Always the same route: the trivial baseline router to compare against."""

    __slots__ = ("_route",)

    def __init__(self, route: Route) -> None:
        self._route = route

    def decide(
        self, features: RequestFeatures, state: LiveState, rng: random.Random | None = None
    ) -> Decision:
        return Decision(self._route, "static")
