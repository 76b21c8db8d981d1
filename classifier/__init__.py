"""Pure routing logic: request body + backend state -> decision and reason.

No aiohttp and no I/O at decision time (DESIGN.md); the one exception is
load_tiktoken_counter, which seeds tiktoken's cache once at start.
"""

from classifier.acceptance import AcceptancePriors
from classifier.acceptance_model import (
    AcceptanceModel,
    AcceptanceRecord,
    ModelFileError,
    fit_acceptance_model,
    load_acceptance_model,
)
from classifier.costmodel import (
    COST_MODEL_REASONS,
    CostModelConfig,
    CostModelPolicy,
    Observation,
    send_batch,
)
from classifier.features import (
    Endpoint,
    FeatureOptions,
    RequestFeatures,
    Workload,
    extract_features,
)
from classifier.latency import LatencyParameters, LatencyPriors, RouteLoad
from classifier.policy import (
    BackendState,
    Decision,
    FinishedRequest,
    GuardsConfig,
    LiveState,
    Policy,
    Route,
    RulesConfig,
    RulesPolicy,
    StaticPolicy,
)
from classifier.tokens import TokenCounter, TokenizerUnavailable, load_tiktoken_counter

__all__ = [
    "COST_MODEL_REASONS",
    "AcceptanceModel",
    "AcceptancePriors",
    "AcceptanceRecord",
    "BackendState",
    "CostModelConfig",
    "CostModelPolicy",
    "Decision",
    "Endpoint",
    "FeatureOptions",
    "FinishedRequest",
    "GuardsConfig",
    "LatencyParameters",
    "LatencyPriors",
    "LiveState",
    "ModelFileError",
    "Observation",
    "Policy",
    "RequestFeatures",
    "Route",
    "RouteLoad",
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
    "send_batch",
]
