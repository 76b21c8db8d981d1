"""Pure routing logic: request body + backend state -> decision and reason.

No aiohttp and no I/O at decision time (DESIGN.md); the one exception is
load_tiktoken_counter, which seeds tiktoken's cache once at start.
"""

from classifier.features import Endpoint, RequestFeatures, Workload, extract_features
from classifier.policy import (
    BackendState,
    Decision,
    LiveState,
    Policy,
    Route,
    RulesConfig,
    RulesPolicy,
    StaticPolicy,
)
from classifier.tokens import TokenCounter, TokenizerUnavailable, load_tiktoken_counter

__all__ = [
    "BackendState",
    "Decision",
    "Endpoint",
    "LiveState",
    "Policy",
    "RequestFeatures",
    "Route",
    "RulesConfig",
    "RulesPolicy",
    "StaticPolicy",
    "TokenCounter",
    "TokenizerUnavailable",
    "Workload",
    "extract_features",
    "load_tiktoken_counter",
]
