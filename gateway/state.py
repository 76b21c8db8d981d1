"""Typed application state: the keys under which create_app stores resources."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from classifier.tokens import TokenCounter
from gateway.backends.pool import BackendPool
from gateway.config import Config
from gateway.outcomes.outcome_log import OutcomeLog
from gateway.outcomes.traffic_sample import Recorder
from gateway.runtime import Runtime
from gateway.shadow.runner import ShadowRunner
from gateway.telemetry import Metrics
from gateway.wire.limits import ByteRate
from gateway.wire.relays import Relays


@dataclass(slots=True)
class ProfileProgress:
    """The running profile's latest stage ("step i of N: what"), for /stats and the
    bench's wait; None when no profile is being measured."""

    stage: str | None = None


CONFIG = web.AppKey("config", Config)  # as at start: what resources were built from
METRICS = web.AppKey("metrics", Metrics)
BACKENDS = web.AppKey("backends", BackendPool)
BIG_BODY_RATE = web.AppKey("big_body_rate", ByteRate)  # server.big_body_mb_s
BIG_BODIES = web.AppKey("big_bodies", asyncio.Semaphore)  # parsed one at a time, off the loop
RELAYS = web.AppKey("relays", Relays)  # answers in flight, for the drain to end
RUNTIME = web.AppKey("runtime", Runtime)  # the reloadable part: config, policy, keys
TOKENS = web.AppKey("tokens", TokenCounter)
# The routing draws' one source (a policy that explores samples from it; seeded by
# routing.tuning.seed, so a replay of the same requests draws the same).
RNG = web.AppKey("rng", random.Random)
SESSION = web.AppKey("session", aiohttp.ClientSession)
OUTCOME_LOG = web.AppKey("outcome_log", OutcomeLog)  # only set when configured
RECORDER = web.AppKey("recorder", Recorder)  # only set when [record] path is configured
SHADOWS = web.AppKey("shadows", ShadowRunner)  # shadow copies in idle GPU time ([shadow])
PROFILE_PROGRESS = web.AppKey("profile_progress", ProfileProgress)
