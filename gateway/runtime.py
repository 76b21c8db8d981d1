"""What a config reload may swap, held so that each request sees one version.

A request reads `app[RUNTIME].current` once and uses that snapshot to the end,
so a reload in the middle of a request never mixes two configs. Settings that
shape resources built at start (sockets, pools, backend lists, files) need a
restart; a reload that changes them is refused whole, with a log line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from classifier.acceptance_model import AcceptanceModel, ModelFileError, load_acceptance_model
from classifier.costmodel import CostModelPolicy
from classifier.policy import Policy, Route, RulesPolicy, StaticPolicy
from gateway.auth import Keys, load_keys
from gateway.config import Config, ConfigError


@dataclass(frozen=True, slots=True)
class Snapshot:
    config: Config
    policy: Policy
    keys: Keys


class Runtime:
    def __init__(self, config: Config) -> None:
        self.current = Snapshot(config, build_policy(config), load_keys(config.auth))
        self.draining = False

    def reload(self, new: Config) -> list[str]:
        """Swap in `new`; return the reloadable sections that changed. Raises ConfigError."""
        old = self.current.config
        blocked = restart_only_changes(old, new)
        if blocked:
            raise ConfigError(f"config: reload refused: {', '.join(blocked)} need a restart")
        keys = load_keys(new.auth)  # re-read: a reload is how keys are rotated
        policy = self.current.policy if new.routing == old.routing else build_policy(new)
        self.current = Snapshot(new, policy, keys)
        sections = ("server", "upstream", "routing", "auth", "logging")
        return [name for name in sections if getattr(old, name) != getattr(new, name)]


def build_policy(config: Config) -> Policy:
    name = config.routing.policy
    if name == "cost-model":
        spec = config.backends.speculative
        cost = replace(
            config.routing.cost_model,
            num_speculative_tokens=spec.num_speculative_tokens,
            draft_cost_ratio=spec.draft_cost_ratio,
        )
        return CostModelPolicy(cost, load_model(config.routing.model_path))
    if name == "static-speculative":
        return StaticPolicy(Route.SPECULATIVE)
    if name == "static-baseline":
        return StaticPolicy(Route.BASELINE)
    return RulesPolicy(config.routing.rules)


def load_model(path: str) -> AcceptanceModel | None:
    """The offline acceptance model, if configured; a bad file is a config error."""
    if not path:
        return None
    try:
        return load_acceptance_model(Path(path).read_bytes())
    except OSError as exc:
        raise ConfigError(
            f"config: routing.model_path: cannot read {path}: {exc.strerror}"
        ) from None
    except ModelFileError as exc:
        raise ConfigError(f"config: routing.model_path: {path}: {exc}") from None


def restart_only_changes(old: Config, new: Config) -> list[str]:
    checks = {
        "backends": (old.backends, new.backends),
        "outcome_log": (old.outcome_log, new.outcome_log),
        "record": (old.record, new.record),
        "server.host/port/max_body_bytes": (
            (old.server.host, old.server.port, old.server.max_body_bytes),
            (new.server.host, new.server.port, new.server.max_body_bytes),
        ),
        "routing.tokenizer": (old.routing.tokenizer, new.routing.tokenizer),
        "upstream pools, probes and ejection": (_fixed(old), _fixed(new)),
    }
    return [name for name, (a, b) in checks.items() if a != b]


def _fixed(config: Config) -> object:
    """The upstream settings that shaped the session and the pool at start."""
    return replace(
        config.upstream,
        connect_timeout_s=0,
        read_timeout_s=0,
        failover=True,
        retry_budget_ratio=0,
        retry_budget_min=0,
    )
