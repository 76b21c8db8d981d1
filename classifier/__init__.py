"""Routing logic without I/O: request body + backend state -> decision and reason.

No aiohttp, no sockets, no clock (docs/ARCHITECTURE.md): deterministic given the
caller's rng. Policies hold what they learned (learn() and its siblings write it;
decide() only reads). The one I/O is load_tiktoken_counter, which seeds tiktoken's
cache once at start.
"""

from classifier.acceptance_model import (
    AcceptanceModel,
    AcceptanceRecord,
    ModelFileError,
    fit_acceptance_model,
    load_acceptance_model,
)
from classifier.features import (
    Endpoint,
    FeatureOptions,
    RequestFeatures,
    Workload,
    extract_features,
)
from classifier.guards import GuardsConfig
from classifier.profile import EngineProfile, ProfileError
from classifier.router import PROFILED_REASONS, ProfiledPolicy, RouterConfig
from classifier.rules import RulesConfig, RulesPolicy, StaticPolicy
from classifier.tokens import TokenCounter, TokenizerUnavailable, load_tiktoken_counter
from classifier.types import (
    PAIR,
    TWO_ROUTES,
    BackendState,
    Decision,
    FinishedRequest,
    LiveState,
    Policy,
    Route,
    RouteSpec,
    two_routes,
)

__all__ = [
    "PAIR",
    "PROFILED_REASONS",
    "TWO_ROUTES",
    "AcceptanceModel",
    "AcceptanceRecord",
    "BackendState",
    "Decision",
    "Endpoint",
    "EngineProfile",
    "FeatureOptions",
    "FinishedRequest",
    "GuardsConfig",
    "LiveState",
    "ModelFileError",
    "Policy",
    "ProfileError",
    "ProfiledPolicy",
    "RequestFeatures",
    "Route",
    "RouteSpec",
    "RouterConfig",
    "RulesConfig",
    "RulesPolicy",
    "StaticPolicy",
    "TokenCounter",
    "TokenizerUnavailable",
    "Workload",
    "extract_features",
    "fit_acceptance_model",
    "load_acceptance_model",
    "load_tiktoken_counter",
    "two_routes",
]
