"""What a config reload may swap, held so that each request sees one version.

A request reads `app[RUNTIME].current` once and uses that snapshot to the end,
so a reload in the middle of a request never mixes two configs. Only the keys
in RELOADABLE are applied by a reload; any other changed key shaped something
built at start (sockets, pools, backend lists, files) and needs a restart, so a
reload that changes one is refused whole, with a log line naming it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

from classifier.acceptance_model import AcceptanceModel, load_acceptance_model
from classifier.router import ProfiledPolicy
from classifier.rules import RulesPolicy, StaticPolicy
from classifier.types import Policy, Route
from gateway.auth import Keys, load_keys
from gateway.config import Config, ConfigError
from gateway.files import read_file

# The keys a reload applies, by who applies them; a table name covers its keys.
# A key not listed here is refused: a new key needs a restart until it is added.
RELOADABLE = (
    # read from the request's snapshot (drain_s when the drain starts)
    "server.allow_route_override",
    "server.body_read_timeout_s",
    "server.send_timeout_s",
    "server.drain_s",
    "upstream.connect_timeout_s",
    "upstream.read_timeout_s",
    "upstream.failover",
    "upstream.retry_budget_ratio",
    "upstream.retry_budget_min",
    # the policy: rebuilt from them, keeping the profile and what it learned
    # (carry_over), since the servers and the features' inputs are the same
    "routing.policy",
    "routing.model_path",
    "routing.guards",
    "routing.tuning",
    # read by the page's handler on every request
    "ui",
    # read from the request's snapshot: its default latency targets
    "latency_targets",
    # the gateway's keys: re-read (a reload is how they are rotated)
    "auth",
    # process-wide: serve.reload applies it
    "logging.level",
)


@dataclass(frozen=True, slots=True)
class Snapshot:
    config: Config
    policy: Policy
    keys: Keys


@dataclass(frozen=True, slots=True)
class Candidate:
    """A reload read and built, not yet in use: `policy` None keeps the one in use (the
    routing table is the same); `base` is the snapshot it was checked against."""

    base: Snapshot
    config: Config
    keys: Keys
    policy: Policy | None


class Runtime:
    def __init__(self, config: Config) -> None:
        self.current = Snapshot(config, build_policy(config), load_keys(config.auth))
        self.draining = False

    def reload(self, new: Config) -> list[str]:
        """Swap in `new`; return the keys that changed. Raises ConfigError."""
        return self.swap(self.prepare(new))

    def prepare(self, new: Config) -> Candidate:
        """The files `new` names, read (the keys file, the model), and its policy built;
        nothing is swapped, so this may run off the event loop. Raises ConfigError."""
        base = self.current
        blocked = restart_only_changes(base.config, new)
        if blocked:
            raise ConfigError(f"config: reload refused: {', '.join(blocked)} need a restart")
        keys = load_keys(new.auth)
        policy = None if new.routing == base.config.routing else build_policy(new)
        return Candidate(base, new, keys, policy)

    def swap(self, candidate: Candidate) -> list[str]:
        """Put a prepared reload in use, on the event loop (it reads what the running
        policy learned); return the keys that changed. Raises ConfigError."""
        if candidate.base is not self.current:
            raise ConfigError("config: reload refused: another reload changed the config first")
        old = self.current
        policy = old.policy if candidate.policy is None else candidate.policy
        carry_over(old.policy, policy)
        self.current = Snapshot(candidate.config, policy, candidate.keys)
        return changed_keys(old.config, candidate.config)


def carry_over(old: Policy, new: Policy) -> None:
    """A rebuilt policy keeps the profile and what was learned: its inputs (the servers,
    the features) did not change, only how it weighs them. Between policies that learn
    nothing, or to one of them, nothing passes."""
    if old is new:
        return
    if old.profile is not None and new.wants_profile:
        new.use_profile(old.profile)
    learned = old.state_to_json()
    if learned is not None:
        with contextlib.suppress(ValueError):  # another k, another policy: it does not apply
            new.load_state(learned)


def build_policy(config: Config) -> Policy:
    routing = config.routing
    name = routing.policy
    if name == "profiled":
        return ProfiledPolicy(
            routing.tuning,
            routes=config.route_specs,
            guards=routing.guards,
            model=load_model(routing.model_path),
        )
    if name.startswith("static-"):  # the config checked it names a route
        return StaticPolicy(Route(name.removeprefix("static-")))
    return RulesPolicy(
        routing.tuning.rules,
        routes=config.route_specs,
        guards=routing.guards,
        features=routing.features,
    )


def load_model(path: str) -> AcceptanceModel | None:
    """The offline acceptance model, if configured; a bad file is a config error (the
    operator named it: it is never silently dropped)."""
    return read_file("routing.model_path", path, load_acceptance_model) if path else None


def restart_only_changes(old: Config, new: Config) -> list[str]:
    """The changed keys a reload cannot apply."""
    return [key for key in changed_keys(old, new) if not is_reloadable(key)]


def is_reloadable(key: str) -> bool:
    return any(key == r or key.startswith(r + ".") for r in RELOADABLE)


def changed_keys(old: Any, new: Any, path: str = "") -> list[str]:
    """The dotted config keys whose values differ, table by table."""
    changed: list[str] = []
    for fld in dataclasses.fields(old):
        key = f"{path}.{fld.name}" if path else fld.name
        a, b = getattr(old, fld.name), getattr(new, fld.name)
        if a == b:
            continue
        if dataclasses.is_dataclass(a) and type(a) is type(b):
            changed += changed_keys(a, b, key)
        else:
            changed.append(key)
    return changed
