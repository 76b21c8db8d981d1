"""The profiled policy's life in `serve`: its profile and its learned state.

At start: the profile file is reloaded when it names exactly the servers that
answer now (model, vLLM version, speculative config, URL), whatever
routing.profile says; otherwise, or when it is missing or unusable (one log
line, gateway/files.py), routing.profile = "at-start" profiles the servers as
soon as both answer and the gateway has nothing in flight ("off" never
measures). Serving never waits for it: decisions made before it is in say
"unprofiled". A failed run is retried in idle time, and so is a profile that
live traffic contradicts. What the policy learned is read from
routing.state_path at start (the same way: used whole, or one line) and written
there every minute and at shutdown. Both files are read off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web

from classifier.profile import EngineProfile, ProfileError, ServerIdentity
from classifier.types import Policy
from gateway.config import Config, RouteConfig
from gateway.files import off_loop, read_optional
from gateway.profiling.probes import ProbeFailed, ProfileTarget, identify, measure_profile
from gateway.state import BACKENDS, CONFIG, METRICS, PROFILE_PROGRESS, RUNTIME, SESSION, TOKENS

log = structlog.get_logger("specroute.profile")

_RETRY_S = 30.0  # after a failed run, and between checks for a contradicted profile
_SAVE_STATE_S = 60.0


def targets(config: Config) -> list[ProfileTarget]:
    """The first URL of each route (a group per GPU runs the same servers: one profile)."""

    def headers(env: str) -> dict[str, str]:
        key = os.environ.get(env, "") if env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def described(c: RouteConfig) -> str:
        if not c.speculative:
            return "none"
        return f"{c.method} k={c.num_speculative_tokens} c={c.draft_cost_ratio:g}"

    return [
        ProfileTarget(
            route.value,
            c.urls[0],
            c.num_speculative_tokens,
            described(c),
            headers(c.api_key_env),
            c.device,
        )
        for route, c in config.routes.items()
    ]


def reference(config: Config) -> ProfileTarget:
    """The route whose server names the model for the probes: the first without
    speculation (its /v1/models is the target's alone), else the first."""
    found = targets(config)
    plain = [t for t, c in zip(found, config.routes.values(), strict=True) if not c.speculative]
    return (plain or found)[0]


def max_batch(config: Config) -> int:
    """The largest batch the probes run: every route's admission limit allows it, 32 at most."""
    return min(*(c.max_inflight for c in config.routes.values()), 32)


def load_profile(path: str) -> EngineProfile | None:
    """The stored profile, or None (absent; unusable: one line, gateway/files.py)."""
    return read_optional("routing.profile_path", path, EngineProfile.loads)


def save_json(path: str, text: str) -> None:
    """Write atomically: a crash mid-write leaves the old file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(target)


async def current_identities(
    session: aiohttp.ClientSession, config: Config
) -> dict[str, ServerIdentity] | None:
    found: dict[str, ServerIdentity] = {}
    for t in targets(config):
        ident = await identify(session, t)
        if ident is None:
            return None
        found[t.name] = ident
    return found


def _policy(app: web.Application) -> Policy | None:
    """The policy in use, if it decides on an engine profile (it wants one measured)."""
    policy = app[RUNTIME].current.policy
    return policy if policy.wants_profile else None


async def profile_ctx(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: the profile loop and the state file, for policy "profiled"."""
    config = app[CONFIG]
    routing = config.routing
    policy = _policy(app)
    if policy is None:
        yield
        return
    if routing.state_path:
        # before the site opens (cleanup_ctx): nothing decides while the thread loads it
        await off_loop(functools.partial(_load_state, policy, routing.state_path))
    task = None
    if routing.profile == "at-start" or routing.profile_path:
        task = asyncio.create_task(_profile_loop(app), name="specroute-profiler")
    saver = asyncio.create_task(_save_state_loop(app), name="specroute-state-saver")
    yield
    for t in (task, saver):
        if t is not None:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
    if routing.state_path and (policy := _policy(app)) is not None:
        _save_state(policy, routing.state_path)


def _load_state(policy: Policy, path: str) -> None:
    def take(data: bytes) -> Policy:
        policy.load_state(json.loads(data))  # all or nothing
        return policy

    if read_optional("routing.state_path", path, take) is not None:
        log.info("router_state_loaded", path=path)


def _save_state(policy: Policy, path: str) -> None:
    learned = policy.state_to_json()
    if learned is None:
        return
    try:
        save_json(path, json.dumps(learned) + "\n")
    except OSError as exc:
        log.warning("router_state_not_saved", path=path, error=str(exc))


async def _save_state_loop(app: web.Application) -> None:
    path = app[CONFIG].routing.state_path
    while path:
        await asyncio.sleep(_SAVE_STATE_S)
        if (policy := _policy(app)) is not None:
            _save_state(policy, path)


async def _profile_loop(app: web.Application) -> None:
    """Reload the stored profile when it names the servers that answer; under "at-start",
    measure one otherwise, then watch for a contradicted one. "off" measures nothing."""
    config = app[CONFIG]
    measure = config.routing.profile == "at-start"
    stored = await off_loop(lambda: load_profile(config.routing.profile_path))
    if stored is None and not measure:
        return
    identities = await current_identities(app[SESSION], config)
    while identities is None:  # the servers are not up yet
        await asyncio.sleep(1.0)
        identities = await current_identities(app[SESSION], config)
    if stored is not None and stored.describes(identities):
        _apply(app, stored, "loaded")
    else:
        if stored is not None:
            # under "off" the gateway stays unprofiled from here: worth a warning
            (log.info if measure else log.warning)(
                "profile_stale",
                path=config.routing.profile_path,
                reason="the servers' identity changed",
                measure=measure,
            )
        if not measure:
            return
        while True:
            if await _measure(app):
                break
            await asyncio.sleep(_RETRY_S)  # a failed run: again in a while
    while measure:
        await asyncio.sleep(_RETRY_S)
        policy = _policy(app)
        if policy is not None and policy.profile_contradicted():
            log.warning(
                "profile_contradicted", drift={r.value: v for r, v in policy.drift().items()}
            )
            await _measure(app)


async def _measure(app: web.Application) -> bool:
    """One profiling run once the gateway is idle; True when a profile was applied."""
    config, pool = app[CONFIG], app[BACKENDS]
    while pool.inflight > 0:
        await pool.wait_idle(5.0)
    started = time.monotonic()
    log.info("profile_started", budget_s=config.routing.profile_budget_s)
    first = reference(config)
    baseline = await identify(app[SESSION], first)
    if baseline is None:
        log.warning("profile_failed", error=f"{first.name} does not answer /v1/models")
        return False
    try:
        profile = await measure_profile(
            app[SESSION],
            targets(config),
            model=baseline.model,
            tokens=app[TOKENS],
            max_batch=max_batch(config),
            budget_s=config.routing.profile_budget_s,
            progress=lambda line: _progress(app, line),
            # specroute's emulator says so in its version (0.32.0+emulated)
            source="emulated" if "emulated" in baseline.version else "measured",
        )
    except (ProbeFailed, ProfileError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
        log.warning("profile_failed", error=str(exc), after_s=round(time.monotonic() - started, 1))
        profile = None
    finally:
        app[PROFILE_PROGRESS].stage = None
    await pool.forget_own_load(app[SESSION], config.upstream.health_timeout_s)
    if profile is None:
        return False
    _apply(app, profile, "measured")
    if config.routing.profile_path:
        try:
            save_json(config.routing.profile_path, profile.dumps())
        except OSError as exc:
            log.warning("profile_not_saved", path=config.routing.profile_path, error=str(exc))
    return True


def _progress(app: web.Application, line: str) -> None:
    """A probe's line to the log; a stage's ("step i of N: ...") also to /stats."""
    log.info("profile_progress", step=line)
    if line.startswith("step "):
        app[PROFILE_PROGRESS].stage = line


def _apply(app: web.Application, profile: EngineProfile, how: str) -> None:
    policy = _policy(app)
    if policy is None:
        return
    policy.use_profile(profile)
    app[METRICS].show_profile(profile)
    log.info(
        "profile_in_use",
        how=how,
        source=profile.source,
        took_s=round(profile.took_s, 2),
        beside={r.name: round(r.beside, 3) for r in profile.routes},
        missing=list(profile.missing),
    )
