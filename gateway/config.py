"""config.toml -> frozen dataclasses.

Every key is declared here once, with its type and default; an unknown key or a
value of the wrong type stops the gateway at start with one line naming the key,
because a typo that silently falls back to a default is the worst kind of
misconfiguration for a router.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from classifier.features import FeatureOptions
from classifier.guards import GuardsConfig
from classifier.router import RouterConfig
from classifier.rules import RulesConfig
from classifier.types import Route


class ConfigError(ValueError):
    """A config problem, phrased for the operator in one line."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 4 * 1024 * 1024
    allow_route_override: bool = True
    # A client must finish sending its body within this time (else 408).
    # Slow header reads are the front proxy's job (nginx, envoy, the LB).
    body_read_timeout_s: float = 30.0
    # On SIGTERM: /ready turns 503 and new requests are refused; in-flight
    # answers get this long to finish before they are cancelled.
    drain_s: float = 30.0
    # An idle keep-alive connection is closed after this long (aiohttp's own
    # default is an hour: 1,000 idle clients would hold 1,000 sockets).
    keepalive_s: float = 75.0
    # Request bodies of 256 KiB or more may arrive at this rate in all (MB/s); past
    # it they wait before being read (a flood of 4 MB bodies cannot take the CPU).
    big_body_mb_s: float = 32.0


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    connect_timeout_s: float = 3.0
    # Longest silence tolerated between two chunks of an answer: generation has
    # no total deadline, but a stalled backend must not hold a client forever.
    read_timeout_s: float = 300.0
    pool_size: int = 256
    health_interval_s: float = 5.0
    health_timeout_s: float = 2.0
    # vLLM /metrics scrape (load, KV usage, speculative counters); figures
    # older than three intervals are treated as unknown.
    scrape_interval_s: float = 2.0
    # Both backends serve the same model, so each is the other's fallback:
    # a refused connection or a 5xx before any byte reached the client is
    # retried once on the other backend, within a retry budget.
    failover: bool = True
    retry_budget_ratio: float = 0.2
    retry_budget_min: int = 3
    eject_after_failures: int = 3
    eject_s: float = 10.0


@dataclass(frozen=True, slots=True)
class BackendConfig:
    urls: tuple[str, ...]
    # Name of the environment variable that holds this backend's API key; the
    # key itself never lives in config.toml.
    api_key_env: str = ""
    # Admission limit: requests in flight to this backend beyond which the
    # other backend answers (if it has room) or the client gets a fast 429.
    max_inflight: int = 256


@dataclass(frozen=True, slots=True)
class SpeculativeBackendConfig(BackendConfig):
    """The speculative server: its --speculative-config as the router needs it. Only
    this route has these keys, so a baseline that names them is a config error."""

    # k proposed tokens per step: tokens per step = 1 + k x acceptance.
    num_speculative_tokens: int = 4
    # One draft token's cost / one target step; only the unprofiled prior uses it
    # (the profile measures the speculative step itself).
    draft_cost_ratio: float = 0.1


class Pairing(enum.StrEnum):
    """Which speculative and baseline URLs share a GPU (backends.pairs)."""

    ONE = "one"  # all URLs of both routes are one pair: one GPU, or not said
    BY_INDEX = "by-index"  # speculative urls[i] and baseline urls[i] share GPU i


@dataclass(frozen=True, slots=True)
class BackendsConfig:
    speculative: SpeculativeBackendConfig
    baseline: BackendConfig
    # A host with N GPUs runs a pair per GPU: "by-index" pairs the routes' URLs
    # by position, and the gateway routes within the least loaded pair.
    pairs: Pairing = Pairing.ONE

    def of(self, route: Route) -> BackendConfig:
        return self.speculative if route is Route.SPECULATIVE else self.baseline


@dataclass(frozen=True, slots=True)
class TuningConfig(RouterConfig):
    """[routing.tuning]: the router's tuning, defaults in code (docs/tuning.md).

    The decision rule's constants (RouterConfig's fields, each with its source),
    how a request is read (every policy sees the same features), and the rules
    comparator's thresholds. config.toml does not list them: a deployment sets
    none of them unless a measurement says so.
    """

    default_temperature: float = 1.0  # what vLLM applies when a request gives none
    default_output_tokens: int = 256  # expected answer length when max_tokens is absent
    long_prompt_tokens: int = 2048  # prompts at least this long count as long_context
    creative_min_temperature: float = 1.0  # an explicit temperature this high is creative
    rules: RulesConfig = field(default_factory=RulesConfig)

    @property
    def features(self) -> FeatureOptions:
        return FeatureOptions(
            default_temperature=self.default_temperature,
            default_output_tokens=self.default_output_tokens,
            long_prompt_tokens=self.long_prompt_tokens,
            creative_min_temperature=self.creative_min_temperature,
        )


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    policy: str = "profiled"
    # Optional acceptance model from `specroute train` (JSON): each request's prior
    # acceptance before its key has measurements; "" = the profile's probes only.
    model_path: str = ""
    guards: GuardsConfig = field(default_factory=GuardsConfig)  # every policy's
    tokenizer: str = "cl100k_base"
    # The engine profile and what was learned on top of it.
    profile: str = "at-start"  # at-start: measure both servers once they answer idle; off
    profile_path: str = ""  # the profile's JSON file: reloaded when it names these servers
    profile_budget_s: float = 600.0  # a profiling run's bound in wall time
    state_path: str = ""  # what the router learned, kept across restarts
    tuning: TuningConfig = field(default_factory=TuningConfig)

    @property
    def features(self) -> FeatureOptions:
        return self.tuning.features


@dataclass(frozen=True, slots=True)
class OutcomeLogConfig:
    path: str = ""  # empty: off
    max_bytes: int = 64 * 1024 * 1024
    backups: int = 3
    include_prompts: bool = False


@dataclass(frozen=True, slots=True)
class RecordConfig:
    """Request recording for `specroute bench --workload FILE --replay-timing`."""

    path: str = ""  # empty: off
    sample_rate: float = 1.0  # share of requests recorded, in (0, 1]
    redaction: str = "placeholders"  # placeholders (same token counts) | off (verbatim!)
    max_bytes: int = 64 * 1024 * 1024
    backups: int = 3


@dataclass(frozen=True, slots=True)
class AuthConfig:
    # Gateway API keys, never in this file: an environment variable holding
    # comma-separated keys and/or a file with one key per line. Neither set:
    # no auth. /metrics can have its own bearer token (environment variable).
    api_keys_env: str = ""
    api_keys_file: str = ""
    metrics_token_env: str = ""


@dataclass(frozen=True, slots=True)
class UiConfig:
    # GET /ui, the side-by-side page (static files shipped in the package). Off:
    # /ui answers 404. The dry-run decision (/decide/...) and the live figures
    # (/stats) are API endpoints: they stay, behind [auth] like the rest.
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class ShadowConfig:
    """Shadow copies (gateway/shadow/runner.py): a sampled share of finished requests is sent
    again, in idle GPU time only, to the route that was not chosen; the answer is
    discarded, the timing pair measures both routes on the same request."""

    enabled: bool = True
    share: float = 0.05  # of successful user requests, in [0, 1]
    max_inflight: int = 1  # shadows running at once, all pairs together


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    level: str = "info"


@dataclass(frozen=True, slots=True)
class Config:
    backends: BackendsConfig
    server: ServerConfig = field(default_factory=ServerConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    outcome_log: OutcomeLogConfig = field(default_factory=OutcomeLogConfig)
    record: RecordConfig = field(default_factory=RecordConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    ui: UiConfig = field(default_factory=UiConfig)
    shadow: ShadowConfig = field(default_factory=ShadowConfig)


_POLICIES = ("profiled", "rules", "static-speculative", "static-baseline")
_PROFILE_MODES = ("at-start", "off")
_LEVELS = ("debug", "info", "warning", "error")
_REDACTIONS = ("placeholders", "off")


def load_config(path: str | Path) -> Config:
    """Read and validate a config file."""
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror}") from None
    except (ValueError, RecursionError) as exc:
        # TOMLDecodeError, and what tomllib lets out: bytes that are not UTF-8, an
        # integer of over 4,300 digits, arrays nested thousands deep
        raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None
    return parse_config(raw)


def parse_config(raw: Mapping[str, Any]) -> Config:
    cfg: Config = _build(Config, raw, "")
    _check(cfg)
    return cfg


def normalize_backend_url(url: str, key: str = "backends") -> str:
    """Accept `http://h:p`, `http://h:p/` or `http://h:p/v1`; return the base."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"config: {key}: {url!r} is not an http(s) URL")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"


def _check(cfg: Config) -> None:
    positive = {
        "server.port": cfg.server.port,
        "server.max_body_bytes": cfg.server.max_body_bytes,
        "upstream.connect_timeout_s": cfg.upstream.connect_timeout_s,
        "upstream.read_timeout_s": cfg.upstream.read_timeout_s,
        "upstream.pool_size": cfg.upstream.pool_size,
        "upstream.health_interval_s": cfg.upstream.health_interval_s,
        "upstream.health_timeout_s": cfg.upstream.health_timeout_s,
        "upstream.scrape_interval_s": cfg.upstream.scrape_interval_s,
        "upstream.eject_after_failures": cfg.upstream.eject_after_failures,
        "upstream.eject_s": cfg.upstream.eject_s,
        "routing.tuning.default_output_tokens": cfg.routing.tuning.default_output_tokens,
        "routing.tuning.long_prompt_tokens": cfg.routing.tuning.long_prompt_tokens,
        "routing.tuning.rules.prefill_ratio": cfg.routing.tuning.rules.prefill_ratio,
        "outcome_log.max_bytes": cfg.outcome_log.max_bytes,
        "record.max_bytes": cfg.record.max_bytes,
        "server.body_read_timeout_s": cfg.server.body_read_timeout_s,
        "server.drain_s": cfg.server.drain_s,
        "server.keepalive_s": cfg.server.keepalive_s,
        "server.big_body_mb_s": cfg.server.big_body_mb_s,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"config: {key} must be > 0, got {value}")
    if cfg.server.port > 65535:
        raise ConfigError(f"config: server.port must be <= 65535, got {cfg.server.port}")
    if not 0.0 <= cfg.routing.tuning.default_temperature <= 2.0:
        raise ConfigError("config: routing.tuning.default_temperature must be within [0, 2]")
    if not cfg.routing.tuning.creative_min_temperature >= 0.0:
        raise ConfigError("config: routing.tuning.creative_min_temperature must be >= 0")
    if cfg.routing.policy not in _POLICIES:
        raise ConfigError(f"config: routing.policy must be one of {', '.join(_POLICIES)}")
    if cfg.routing.profile not in _PROFILE_MODES:
        raise ConfigError(f"config: routing.profile must be one of {', '.join(_PROFILE_MODES)}")
    if not cfg.routing.profile_budget_s > 0:
        raise ConfigError("config: routing.profile_budget_s must be > 0")
    if not 0.0 <= cfg.upstream.retry_budget_ratio <= 1.0 or cfg.upstream.retry_budget_min < 0:
        raise ConfigError("config: upstream.retry_budget_ratio must be in [0, 1], _min >= 0")
    if cfg.outcome_log.backups < 0:
        raise ConfigError("config: outcome_log.backups must be >= 0")
    if not 0.0 < cfg.record.sample_rate <= 1.0:
        raise ConfigError("config: record.sample_rate must be within (0, 1]")
    if cfg.record.redaction not in _REDACTIONS:
        raise ConfigError(f"config: record.redaction must be one of {', '.join(_REDACTIONS)}")
    if cfg.record.backups < 0:
        raise ConfigError("config: record.backups must be >= 0")
    if not 0.0 <= cfg.shadow.share <= 1.0:
        raise ConfigError(f"config: shadow.share must be within [0, 1], got {cfg.shadow.share}")
    if cfg.shadow.max_inflight < 1:
        raise ConfigError("config: shadow.max_inflight must be >= 1")
    if cfg.logging.level not in _LEVELS:
        raise ConfigError(f"config: logging.level must be one of {', '.join(_LEVELS)}")
    for route in Route:
        backend = cfg.backends.of(route)
        if not backend.urls:
            raise ConfigError(f"config: backends.{route}.urls must list at least one URL")
        if backend.max_inflight < 1:
            raise ConfigError(f"config: backends.{route}.max_inflight must be >= 1")
    spec = cfg.backends.speculative
    if spec.num_speculative_tokens < 1 or spec.draft_cost_ratio < 0:
        raise ConfigError(
            "config: backends.speculative: num_speculative_tokens must be >= 1"
            " and draft_cost_ratio >= 0"
        )
    check_pairs(cfg.backends)


def check_pairs(backends: BackendsConfig) -> None:
    """backends.pairs = "by-index" needs a baseline URL for every speculative one."""
    spec, base = len(backends.speculative.urls), len(backends.baseline.urls)
    if backends.pairs is Pairing.BY_INDEX and spec != base:
        raise ConfigError(
            f'config: backends.pairs = "by-index" pairs speculative and baseline URLs by'
            f" position, so it needs as many of each: got {spec} speculative"
            f" (backends.speculative.urls) and {base} baseline (backends.baseline.urls)"
        )


def _build(cls: type[Any], raw: Any, path: str) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config: {path or 'top level'} must be a table")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in known:
            raise ConfigError(f"config: unknown key {_join(path, key)!r}{_hint(cls, key)}")
    kwargs: dict[str, Any] = {}
    for name, fld in known.items():
        key = _join(path, name)
        if name not in raw:
            no_default = (
                fld.default is dataclasses.MISSING and fld.default_factory is dataclasses.MISSING
            )
            if no_default:
                raise ConfigError(f"config: missing key {key!r}")
            continue
        kwargs[name] = _convert(hints[name], raw[name], key)
    try:
        return cls(**kwargs)
    except ValueError as exc:  # a dataclass's own validation
        raise ConfigError(f"config: {path}: {exc}") from None


def _convert(hint: Any, value: Any, key: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return _build(typing.cast(type[Any], hint), value, key)
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            raise ConfigError(f"config: {key} must be one of {typing.get_args(hint)}")
        return value
    if origin in (types.UnionType, typing.Union):
        # `X | None`: TOML has no null, a present key is an X. `bool | Literal["auto"]`:
        # the first member that takes the value.
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        for member in members[:-1]:
            try:
                return _convert(member, value, key)
            except ConfigError:
                continue
        try:
            return _convert(members[-1], value, key)
        except ConfigError:
            if len(members) == 1:
                raise
            allowed = " or ".join(_describe(m) for m in members)
            raise ConfigError(f"config: {key} must be {allowed}, got {value!r}") from None
    if origin is tuple:
        (item,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise ConfigError(f"config: {key} must be a list")
        items = [_convert(item, v, key) for v in value]
        if key.startswith("backends.") and key.endswith(".urls"):
            items = [normalize_backend_url(v, key) for v in items]
        return tuple(items)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            allowed = ", ".join(str(m.value) for m in hint)
            raise ConfigError(f"config: {key} must be one of {allowed}, got {value!r}") from None
    if hint is float:
        # Every float key, here once: TOML has nan and inf, and an integer past a float's
        # range overflows; no setting means any of them (nan even passes "must be > 0").
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"config: {key} must be a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(f"config: {key} must be a finite number, got {number}")
        return number
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config: {key} must be an integer, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config: {key} must be true or false, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"config: {key} must be a string, got {value!r}")
        return value
    raise ConfigError(f"config: {key}: unsupported type {hint!r}")


def _hint(cls: type[Any], key: str) -> str:
    """A key another table holds: say which, rather than only "unknown"."""
    if cls is BackendConfig and key in ("num_speculative_tokens", "draft_cost_ratio"):
        return " (only backends.speculative has it)"
    if cls is RoutingConfig and key in {f.name for f in dataclasses.fields(TuningConfig)}:
        return f" (the router's tuning: routing.tuning.{key}, docs/tuning.md)"
    return ""


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return " or ".join(f'"{v}"' for v in typing.get_args(hint))
    return "true or false" if hint is bool else getattr(hint, "__name__", str(hint))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
