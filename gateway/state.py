"""Typed application state: the keys under which create_app stores resources."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from classifier.policy import Policy
from classifier.tokens import TokenCounter
from gateway.backends import BackendPool
from gateway.config import Config
from gateway.outcome_log import OutcomeLog
from gateway.telemetry import Metrics

CONFIG = web.AppKey("config", Config)
METRICS = web.AppKey("metrics", Metrics)
BACKENDS = web.AppKey("backends", BackendPool)
POLICY = web.AppKey("policy", Policy)
TOKENS = web.AppKey("tokens", TokenCounter)
SESSION = web.AppKey("session", aiohttp.ClientSession)
OUTCOME_LOG = web.AppKey("outcome_log", OutcomeLog)  # only set when configured
