"""config.toml -> frozen dataclasses, and the JSON Schema editors read.

Every key is declared here once, with its type and default; an unknown key or a
value of the wrong type stops the gateway at start with a line naming the key (one
line per problem, all of them at once, with "did you mean" and the table a misplaced
key belongs in), because a typo that silently falls back to a default is the worst
kind of misconfiguration for a router. The comments above and beside each field are
its description in `json_schema()` (`specroute config --schema`).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import inspect
import json
import math
import os
import re
import stat
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from classifier.features import FeatureOptions
from classifier.guards import GuardsConfig
from classifier.router import RouterConfig
from classifier.rules import RulesConfig
from classifier.speculation import Schedule, parse_schedule
from classifier.types import ROUTE_NAME, Route, RouteSpec
from gateway.addresses import BASE_URL, HOST, base_url, schema_pattern, server_key, url_problem


class ConfigError(ValueError):
    """A config problem, phrased for the operator: one line, or a count and one line per
    problem when a file has several."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 4 * 1024 * 1024
    allow_route_override: bool = True
    # A client must finish sending its body within this time (else 408).
    # Slow header reads are the front proxy's job (nginx, envoy, the LB).
    body_read_timeout_s: float = 30.0
    # A write to a client that makes no progress for this long (it stopped reading)
    # ends its answer: the backend's slot is freed and its request cancelled.
    send_timeout_s: float = 30.0
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
    # vLLM's speculative method (a label: k and the profile are what the router uses).
    method: str = "draft_model"


@dataclass(frozen=True, slots=True)
class RouteConfig(BackendConfig):
    """[routes.NAME]: one server configuration of the model, by the name the gateway's
    metrics, logs and headers give it. The tables' order is the routes' order."""

    # vLLM's speculative method (its --speculative-config "method"): ngram, eagle,
    # eagle3, draft_model, mtp, ...; "none": the server runs without speculation.
    method: str = "none"
    # k proposed tokens per step: tokens per step = 1 + k x acceptance (0 with "none").
    num_speculative_tokens: int = 0
    # A dynamic-speculation server: its K per batch size, as vLLM's --speculative-config
    # num_speculative_tokens_per_batch_size: [[range_start, range_end, K], ...], inclusive
    # ranges of the batch size from 1, K from 0 (no drafts) to num_speculative_tokens.
    # Unset or []: static k.
    num_speculative_tokens_per_batch_size: Schedule = ()
    # One draft token's cost / one target step; only the unprofiled prior uses it
    # (the profile measures each route's step itself). n-gram: about 0.
    draft_cost_ratio: float = 0.0
    # The device its server runs on (a GPU, a CPU core set: any name). Routes that name
    # the same device are time-sliced on it, and a busy one slows its neighbours' steps
    # (the profile measures by how much); routes on different devices do not. Unset on
    # every route: they all share one device. Set on one, set on all.
    device: str = ""

    @property
    def speculative(self) -> bool:
        return self.num_speculative_tokens > 0

    def spec(self, name: Route) -> RouteSpec:
        """What a policy knows of this route before its profile."""
        k, method, cost = self.num_speculative_tokens, self.method, self.draft_cost_ratio
        schedule = parse_schedule(self.num_speculative_tokens_per_batch_size)
        return RouteSpec(name, k, method, cost, self.device, schedule)


class Pairing(enum.StrEnum):
    """Which routes' URLs share a GPU (backends.pairs)."""

    ONE = "one"  # all URLs of all routes are one group: one GPU, or not said
    BY_INDEX = "by-index"  # urls[i] of every route share GPU i


@dataclass(frozen=True, slots=True)
class BackendsConfig:
    # The two-route configuration: routes "speculative" and "baseline". Instead of
    # [routes.NAME] tables, never with them.
    speculative: SpeculativeBackendConfig | None = None
    baseline: BackendConfig | None = None
    # A host with N GPUs runs a server of every route on each GPU: "by-index" groups
    # the routes' URLs by position, and the gateway routes within the least loaded group.
    pairs: Pairing = Pairing.ONE


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
class LatencyTargetConfig:
    """[latency_targets.MODEL]: the latency targets of the requests for MODEL (their
    `model`; "*": every model without a table of its own) that send none. A request's
    x-llm-d-slo-ttft-ms and x-llm-d-slo-tpot-ms headers replace them, each its own."""

    # Time to the first token, in ms. Measured on streamed requests only.
    ttft_ms: float | None = None
    # Time per output token after the first, in ms. Measured on streamed requests only.
    tpot_ms: float | None = None


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    level: str = "info"


@dataclass(frozen=True, slots=True)
class Config:
    # The server configurations, by name ([routes.NAME]); resolved at load: the
    # two-route [backends.speculative] and [backends.baseline] become two entries.
    routes: Mapping[Route, RouteConfig] = field(default_factory=dict)
    backends: BackendsConfig = field(default_factory=BackendsConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    outcome_log: OutcomeLogConfig = field(default_factory=OutcomeLogConfig)
    record: RecordConfig = field(default_factory=RecordConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    ui: UiConfig = field(default_factory=UiConfig)
    shadow: ShadowConfig = field(default_factory=ShadowConfig)
    # Latency targets per model, for requests that send no SLO header (docs/api.md).
    latency_targets: Mapping[str, LatencyTargetConfig] = field(default_factory=dict)

    @property
    def route_specs(self) -> tuple[RouteSpec, ...]:
        """Every route's speculation, in order: what a policy is built with."""
        return tuple(c.spec(name) for name, c in self.routes.items())


_POLICIES = ("profiled", "rules", "static-<route name>")
_PROFILE_MODES = ("at-start", "off")
_LEVELS = ("debug", "info", "warning", "error")
_REDACTIONS = ("placeholders", "off")

# The checks a table's values get once its types are right; the schema states them too.
_CHOICES: dict[type[Any], dict[str, tuple[str, ...]]] = {
    RoutingConfig: {"profile": _PROFILE_MODES},
    LoggingConfig: {"level": _LEVELS},
    RecordConfig: {"redaction": _REDACTIONS},
}
_ROUTE = ROUTE_NAME.pattern.strip("^$")
# Patterns, checked whole (re.fullmatch) by the loader and stated in the schema; a list's
# for each of its items. The policy's is checked against the routes (_routes_problems).
_PATTERNS: dict[type[Any], dict[str, str]] = {
    ServerConfig: {"host": HOST},
    BackendConfig: {"urls": BASE_URL},
    RoutingConfig: {"policy": f"profiled|rules|static-{_ROUTE}"},
}


@dataclass(frozen=True, slots=True)
class _Range:
    """A number's bounds beyond "> 0" (_POSITIVE): checked here, stated in the schema."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def words(self) -> str:
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"within {left}{self.low:g}, {self.high:g}{right}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"{'<' if self.high_open else '<='} {self.high:g}"

    def schema(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.low is not None:
            out["exclusiveMinimum" if self.low_open else "minimum"] = self.low
        if self.high is not None:
            out["exclusiveMaximum" if self.high_open else "maximum"] = self.high
        return out


_SHARE, _DRAFT, _AT_LEAST_0, _AT_LEAST_1 = _Range(0, 1), _Range(0, 10), _Range(0), _Range(1)
# A K schedule's rules between its values (the schema cannot state them): what its
# problems say.
SCHEDULE_ACROSS = "want ranges from 1, each start <= end, none overlapping, K <= k"
# A latency target in ms: above 0, at most an hour (the headers' bound too).
MAX_TARGET_MS = 3_600_000.0
_TARGET_MS = _Range(0, MAX_TARGET_MS, low_open=True)
# Tables are found by their class or a base class (RouterConfig's bounds are its own
# __post_init__'s, stated here for the schema).
_BOUNDS: dict[type[Any], dict[str, _Range]] = {
    ServerConfig: {"port": _Range(high=65535)},
    UpstreamConfig: {"retry_budget_ratio": _SHARE, "retry_budget_min": _AT_LEAST_0},
    BackendConfig: {"max_inflight": _AT_LEAST_1},
    SpeculativeBackendConfig: {"num_speculative_tokens": _AT_LEAST_1, "draft_cost_ratio": _DRAFT},
    RouteConfig: {"num_speculative_tokens": _AT_LEAST_0, "draft_cost_ratio": _DRAFT},
    TuningConfig: {"default_temperature": _Range(0, 2), "creative_min_temperature": _AT_LEAST_0},
    RouterConfig: {
        "explore_max_regret": _AT_LEAST_0,
        "probe_weight": _Range(0, low_open=True),
        "prior_sd": _Range(0, 0.5, low_open=True),
        "acceptance_memory": _AT_LEAST_1,
        "drift_memory": _AT_LEAST_1,
        "failure_memory": _AT_LEAST_1,
        "contradiction_ratio": _Range(1, low_open=True),
        "contradiction_after": _AT_LEAST_1,
    },
    GuardsConfig: {
        "spec_max_inflight": _AT_LEAST_1,
        "spec_max_kv_usage": _Range(0, 1, low_open=True),
    },
    OutcomeLogConfig: {"backups": _AT_LEAST_0},
    RecordConfig: {"backups": _AT_LEAST_0, "sample_rate": _Range(0, 1, low_open=True)},
    ShadowConfig: {"share": _SHARE, "max_inflight": _AT_LEAST_1},
    LatencyTargetConfig: {"ttft_ms": _TARGET_MS, "tpot_ms": _TARGET_MS},
}


def _declared(table: Mapping[type[Any], Mapping[str, Any]], cls: type[Any]) -> dict[str, Any]:
    """What `table` declares for `cls` and its base classes (the class's own last)."""
    return {k: v for klass in reversed(cls.__mro__) for k, v in table.get(klass, {}).items()}


_POSITIVE: dict[type[Any], tuple[str, ...]] = {
    ServerConfig: (
        "port",
        "max_body_bytes",
        "body_read_timeout_s",
        "send_timeout_s",
        "drain_s",
        "keepalive_s",
        "big_body_mb_s",
    ),
    UpstreamConfig: (
        "connect_timeout_s",
        "read_timeout_s",
        "pool_size",
        "health_interval_s",
        "health_timeout_s",
        "scrape_interval_s",
        "eject_after_failures",
        "eject_s",
    ),
    RoutingConfig: ("profile_budget_s",),
    TuningConfig: ("default_output_tokens", "long_prompt_tokens"),
    RulesConfig: ("prefill_ratio",),
    OutcomeLogConfig: ("max_bytes",),
    RecordConfig: ("max_bytes",),
}


# Far above any file the gateway reads (config.toml, a state, a profile: kilobytes): a
# path such as /dev/zero must not take the memory.
MAX_FILE_BYTES = 64 * 1024 * 1024
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class Unreadable(Exception):
    """Why a file was not read, in one line; `missing`: there is no such file."""

    def __init__(self, why: str, *, missing: bool = False) -> None:
        super().__init__(why)
        self.missing = missing


def not_regular(mode: int) -> str | None:
    """Why a file of this mode is not read (or written) as a file, or None: it is one."""
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a file")
    return f"is {kind}, not a regular file"


def read_regular(path: str | Path) -> bytes:
    """The bytes of the regular file at `path`, else Unreadable. This module reads
    config.toml with it and gateway/files.py every other file, so none waits: a FIFO
    would block the open until a writer came, and a device (/dev/zero, a tty) never
    ends. The path is stat-ed first, and opened with O_NONBLOCK, so that one swapped
    in between still cannot block the open."""
    try:
        if why := not_regular(os.stat(path).st_mode):
            raise Unreadable(why)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as fh:
            if why := not_regular(os.fstat(fd).st_mode):  # swapped in since the stat
                raise Unreadable(why)
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        why = f"cannot read: {exc.strerror or exc}"
        raise Unreadable(why, missing=isinstance(exc, FileNotFoundError)) from None
    except ValueError:  # os.stat refuses a NUL byte before asking the system
        raise Unreadable("a path cannot hold a NUL byte") from None
    if len(data) > MAX_FILE_BYTES:
        raise Unreadable(f"larger than {MAX_FILE_BYTES} bytes")
    return data


class _Reported(Exception):
    """A table below failed; its problems are already in the list."""


def load_config(path: str | Path) -> Config:
    """Read and validate a config file (--config, SPECROUTE_CONFIG, SIGHUP's re-read):
    a path that is no regular file is one line at once (read_regular)."""
    try:
        raw = tomllib.loads(read_regular(path).decode())
    except Unreadable as exc:
        raise ConfigError(f"config: --config: {path}: {exc}") from None
    except (ValueError, RecursionError) as exc:
        # TOMLDecodeError, and what tomllib lets out: bytes that are not UTF-8, an
        # integer of over 4,300 digits, arrays nested thousands deep
        raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None
    return parse_config(raw)


def parse_config(raw: Mapping[str, Any]) -> Config:
    """The config, or one ConfigError that lists every problem of `raw`: the tables'
    (types, values) and the routes' (names, policy, devices) in one pass, so that
    fixing one does not uncover the next. A bad value has its default in place, so the
    routes' checks still run; not where a server table could not be built at all
    (they would only say it is missing)."""
    problems: list[str] = []
    cfg = _build(Config, raw, "", problems)
    if cfg is not None and _servers_built(cfg, raw):
        cfg = _resolve_routes(cfg, problems)
    if problems or cfg is None:
        raise _error(problems or ["top level: not a config"])
    return typing.cast(Config, cfg)


def _servers_built(cfg: Config, raw: Mapping[str, Any]) -> bool:
    """Every [routes.NAME] and [backends.ROUTE] table of `raw` is in `cfg`."""
    routes, backends = raw.get("routes", {}), raw.get("backends", {})
    if not isinstance(routes, Mapping) or len(routes) != len(cfg.routes):
        return False
    if not isinstance(backends, Mapping):
        return False
    return all(
        getattr(cfg.backends, r) is not None for r in ("speculative", "baseline") if r in backends
    )


def _error(problems: list[str]) -> ConfigError:
    if len(problems) == 1:
        return ConfigError(f"config: {problems[0]}")
    return ConfigError(f"config: {len(problems)} errors:" + "".join(f"\n  - {p}" for p in problems))


def normalize_backend_url(url: str, key: str = "backends") -> str:
    """Accept `http://h:p`, `http://h:p/` or `http://h:p/v1`; return the base."""
    problem = url_problem(url)
    if problem is not None:
        raise ConfigError(f"config: {key}: {url!r} {problem}")
    return base_url(url)


def config_warnings(cfg: Config) -> list[str]:
    """What is allowed but likely a mistake, one line each: two routes on one server
    (the tests and smoke runs do it on purpose, with one fake server for every route;
    in production the router would compare a server with itself)."""
    owners: dict[tuple[str, str, int, str], list[str]] = {}
    for name, route in cfg.routes.items():
        for key in dict.fromkeys(server_key(u) for u in route.urls):
            owners.setdefault(key, []).append(name)
    return [
        f"routes {', '.join(names)} name the same server {scheme}://{host}:{port}{path}"
        for (scheme, host, port, path), names in owners.items()
        if len(names) > 1
    ]


def check_routes(cfg: Config) -> None:
    """The routes' checks again, after a change (a URL from the command line)."""
    problems = list(_routes_problems(cfg))
    if problems:
        raise _error(problems)


def _resolve_routes(cfg: Config, problems: list[str]) -> Config | None:
    """The routes by name, whichever way the file gave them, and their checks: two or
    more, one without speculation at least for the rules... (see _routes_problems)."""
    spec, base = cfg.backends.speculative, cfg.backends.baseline
    routes: dict[Route, RouteConfig] = {}
    if cfg.routes:
        if spec is not None or base is not None:
            problems.append(
                "[routes.NAME] tables and [backends.speculative]/[backends.baseline] name"
                " the servers twice: keep one (the [routes.NAME] tables)"
            )
            return None
        routes = {Route(name): c for name, c in cfg.routes.items()}
    elif spec is None or base is None:
        problems.append(
            "no servers: want [routes.NAME] tables (urls, method, num_speculative_tokens)"
            " or both [backends.speculative] and [backends.baseline]"
        )
        return None
    else:
        routes = {
            Route.SPECULATIVE: RouteConfig(
                urls=spec.urls,
                api_key_env=spec.api_key_env,
                max_inflight=spec.max_inflight,
                method=spec.method,
                num_speculative_tokens=spec.num_speculative_tokens,
                draft_cost_ratio=spec.draft_cost_ratio,
            ),
            Route.BASELINE: RouteConfig(
                urls=base.urls, api_key_env=base.api_key_env, max_inflight=base.max_inflight
            ),
        }
    resolved = dataclasses.replace(cfg, routes=routes)
    problems.extend(_routes_problems(resolved))
    return None if problems else resolved


def _routes_problems(cfg: Config) -> Iterator[str]:
    """Names a label and a header can hold; two routes or more; a policy that names one;
    by-index groups of as many URLs per route."""
    routes = cfg.routes
    for name, route in routes.items():
        if not ROUTE_NAME.fullmatch(name):
            shown = name if re.fullmatch("[A-Za-z0-9_-]+", name) else json.dumps(name)
            yield f"[routes.{shown}]: a route's name is [a-z0-9][a-z0-9_-]*, at most 63 characters"
        keys = [server_key(u) for u in route.urls]
        if len(set(keys)) < len(keys):
            yield f"routes.{name}.urls: a server listed twice ({', '.join(route.urls)})"
    if len(routes) < 2:
        yield f"want two routes or more, got {len(routes)} ({', '.join(routes) or 'none'})"
    policy = cfg.routing.policy
    names = [f"static-{r}" for r in routes]
    if policy not in ("profiled", "rules", *names):
        yield _not_one_of("routing.policy", policy, ("profiled", "rules", *names))
    default = cfg.routing.tuning.rules.default_route
    if default is not None and default not in routes:
        yield _not_one_of("routing.tuning.rules.default_route", default, tuple(routes))
    if policy == "rules" and not (
        any(c.speculative for c in routes.values())
        and any(not c.speculative for c in routes.values())
    ):
        yield 'routing.policy = "rules" wants a route with speculation and one without'
    devices = {name: c.device for name, c in routes.items()}
    if any(devices.values()) and not all(devices.values()):
        unset = ", ".join(n for n, d in devices.items() if not d)
        yield (
            "[routes.NAME] device: set on every route or on none (the routes without one"
            f" would share which device?): unset on {unset}"
        )
    if cfg.backends.pairs is Pairing.BY_INDEX:
        counts = {name: len(c.urls) for name, c in routes.items()}
        if len(set(counts.values())) > 1:
            got = ", ".join(f"{n} {c}" for n, c in counts.items())
            yield (
                f'backends.pairs = "by-index" groups the routes\' URLs by position, so it'
                f" needs as many for each route: got {got}"
            )


def _table_problems(obj: Any, path: str) -> Iterator[str]:
    """What is wrong with one table whose values have the right types."""
    key = functools.partial(_join, path)
    for name in _POSITIVE.get(type(obj), ()):
        if not getattr(obj, name) > 0:
            yield f"{key(name)} must be > 0, got {getattr(obj, name)}"
    for name, allowed in _CHOICES.get(type(obj), {}).items():
        if getattr(obj, name) not in allowed:
            yield _not_one_of(key(name), getattr(obj, name), allowed)
    for name, bounds in _declared(_BOUNDS, type(obj)).items():
        value = getattr(obj, name)
        if value is not None and not bounds.holds(value):
            yield f"{key(name)} must be {bounds.words()}, got {value}"
    if isinstance(obj, ServerConfig) and not re.fullmatch(HOST, obj.host):
        yield f"{key('host')} = {obj.host!r}: not a host name or IP address"
    if isinstance(obj, BackendConfig) and not obj.urls:
        yield f"{key('urls')} must list at least one URL"
    if isinstance(obj, SpeculativeBackendConfig | RouteConfig):
        k, method = obj.num_speculative_tokens, obj.method
        if (k == 0) != (method == "none"):
            yield (
                f"{key('num_speculative_tokens')} = {k} with {key('method')} = {method!r}:"
                ' a route speculates (k >= 1, a method) or not (k = 0, "none")'
            )
    if isinstance(obj, RouteConfig) and obj.num_speculative_tokens_per_batch_size:
        yield from _schedule_problems(obj, key("num_speculative_tokens_per_batch_size"))
    if isinstance(obj, OutcomeLogConfig) and obj.path:
        yield from _log_path_problems(key("path"), obj.path)
    if isinstance(obj, LatencyTargetConfig) and obj.ttft_ms is None and obj.tpot_ms is None:
        yield f"[{path}] sets no target: want ttft_ms, tpot_ms or both"


def _schedule_problems(route: RouteConfig, key: str) -> Iterator[str]:
    """A K schedule as vLLM reads it, its K at most the route's num_speculative_tokens,
    and only on a route that speculates. The schema states the entries' form and signs;
    their order and the K's bound are checks between values (SCHEDULE_ACROSS)."""
    schedule = route.num_speculative_tokens_per_batch_size
    if route.num_speculative_tokens == 0:
        yield f"{key}: a route without speculation proposes no K"
        return
    bad = [e for e in schedule if min(e[0], e[1]) < 1 or e[2] < 0]
    if bad:
        yield f"{key}: want batch sizes >= 1 and K >= 0 in each entry, got {list(bad[0])}"
        return
    try:
        parse_schedule(schedule)
    except ValueError as exc:
        yield f"{key}: {SCHEDULE_ACROSS} ({exc})"
        return
    k = route.num_speculative_tokens
    if max(e[2] for e in schedule) > k:
        yield f"{key}: {SCHEDULE_ACROSS} (a K above num_speculative_tokens = {k}, its most)"


def _log_path_problems(key: str, path: str) -> Iterator[str]:
    """A log the gateway appends to: a regular file, or none yet in a directory it can
    write. A directory, a FIFO (the writer's open would wait for a reader) or a device
    (/dev/full) would lose every line, so each is refused at start, in one line."""
    where = f"{key} = {path!r}"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        parent = os.path.dirname(path) or "."
        if not os.path.isdir(parent):
            yield f"{where}: its directory {parent!r} does not exist"
        elif not os.access(parent, os.W_OK | os.X_OK):
            yield f"{where}: its directory {parent!r} is not writable"
        return
    except OSError as exc:
        yield f"{where}: {exc.strerror or exc}"
        return
    except ValueError:  # os.stat refuses a NUL byte before asking the system
        yield f"{where}: a path cannot hold a NUL byte"
        return
    if stat.S_ISDIR(mode):
        yield f"{where}: is a directory, not a file"
    elif not stat.S_ISREG(mode):
        yield f"{where}: not a regular file (a FIFO, a socket or a device)"
    elif not os.access(path, os.W_OK):
        yield f"{where}: not writable"


def _not_one_of(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(value), allowed, n=1)
    mean = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{key} must be one of {', '.join(allowed)}, got {value!r}{mean}"


def _build(cls: type[Any], raw: Any, path: str, problems: list[str]) -> Any:
    """An instance of `cls`, or None; every problem found on the way is appended. A bad
    key with a default leaves the default in its place, so the table's other checks
    still run and one pass reports everything."""
    if not isinstance(raw, Mapping):
        problems.append(f"{path or 'top level'} must be a table")
        return None
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    problems.extend(_unknown(cls, path, str(k), v) for k, v in raw.items() if k not in known)
    kwargs: dict[str, Any] = {}
    complete = True
    for name, fld in known.items():
        key = _join(path, name)
        has_default = not (
            fld.default is dataclasses.MISSING and fld.default_factory is dataclasses.MISSING
        )
        if name not in raw:
            if not has_default:
                problems.append(f"missing key {key!r}")
                complete = False
            continue
        try:
            kwargs[name] = _convert(hints[name], raw[name], key, problems)
        except _Reported:
            complete = complete and has_default
        except ConfigError as exc:
            problems.append(str(exc).removeprefix("config: "))
            complete = complete and has_default
    if not complete:
        return None
    try:
        obj = cls(**kwargs)
    except ValueError as exc:  # a dataclass's own validation
        problems.append(f"{path}: {exc}")
        return None
    problems.extend(_table_problems(obj, path))
    return obj


def _convert(hint: Any, value: Any, key: str, problems: list[str]) -> Any:
    if dataclasses.is_dataclass(hint):
        built = _build(typing.cast(type[Any], hint), value, key, problems)
        if built is None:
            raise _Reported
        return built
    origin = typing.get_origin(hint)
    if origin is Mapping:  # tables by name ([routes.NAME]), in the file's order
        _, item = typing.get_args(hint)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be tables: [{key}.NAME]")
        built_items: dict[str, Any] = {}
        failed = False
        for name, table in value.items():
            if not name:
                problems.append(f"{key}: a table's name cannot be empty")
                failed = True
                continue
            try:
                built_items[str(name)] = _convert(item, table, _join(key, str(name)), problems)
            except _Reported:
                failed = True
        if failed:
            raise _Reported
        return built_items
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            raise ConfigError(f"{key} must be one of {typing.get_args(hint)}")
        return value
    if origin in (types.UnionType, typing.Union):
        # `X | None`: TOML has no null, a present key is an X. `bool | Literal["auto"]`:
        # the first member that takes the value.
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        for member in members[:-1]:
            try:
                return _convert(member, value, key, problems)
            except ConfigError:
                continue
        try:
            return _convert(members[-1], value, key, problems)
        except ConfigError:
            if len(members) == 1:
                raise
            allowed = " or ".join(_describe(m) for m in members)
            raise ConfigError(f"{key} must be {allowed}, got {value!r}") from None
    if origin is tuple:
        args = typing.get_args(hint)
        (item,) = {a for a in args if a is not Ellipsis}
        if isinstance(value, str):  # `urls = "http://..."`: say how to write the list
            leaf = key.rsplit(".", 1)[-1]
            raise ConfigError(f"{key} must be a list, not a string: {leaf} = [{json.dumps(value)}]")
        if Ellipsis not in args and not (isinstance(value, list) and len(value) == len(args)):
            raise ConfigError(f"{key} must be lists of {len(args)} items, got {value!r}")
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list")
        items = [_convert(item, v, key, problems) for v in value]
        if key.startswith(("backends.", "routes.")) and key.endswith(".urls"):
            items = [normalize_backend_url(v, key) for v in items]
        return tuple(items)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            values = tuple(str(m.value) for m in hint)
            raise ConfigError(_not_one_of(key, value, values)) from None
    if hint is float:
        # Every float key, here once: TOML has nan and inf, and an integer past a float's
        # range overflows; no setting means any of them (nan even passes "must be > 0").
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(f"{key} must be a finite number, got {number}")
        return number
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if hint is Route:
        if not (isinstance(value, str) and ROUTE_NAME.fullmatch(value)):
            raise ConfigError(f"{key} must be a route's name, got {value!r}")
        return Route(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {hint!r}")


# Keys an earlier version read, and why they are gone: said instead of "unknown".
_RETIRED = {
    "switch_margin": "one cost model prices every move; remove it (docs/decision.md)",
    "move_horizon_lives": "the followers' horizon is derived from the load; remove it "
    "(docs/decision.md)",
}


def _unknown(cls: type[Any], path: str, name: str, value: Any) -> str:
    """An unknown key, with the table it belongs in or the key it is a typo of."""
    key = _join(path, name)
    if name in _RETIRED:
        return f"key {key!r} was retired: {_RETIRED[name]}"
    tables = _tables_of()
    elsewhere = [t for t in tables.get(name, ()) if t != path]
    if elsewhere:
        where = " or ".join(_table_name(t) for t in elsewhere)
        if isinstance(value, Mapping) and len(elsewhere) == 1:  # a table: name its place
            where += f" (as [{_join(elsewhere[0], name)}])"
        docs = " (docs/tuning.md)" if any(t.startswith("routing.tuning") for t in elsewhere) else ""
        return f"unknown key {key!r}: it belongs in {where}, not {_table_name(path)}{docs}"
    close = difflib.get_close_matches(name, [f.name for f in dataclasses.fields(cls)], n=1)
    if close:
        return f"unknown key {key!r} (did you mean {_join(path, close[0])!r}?)"
    close = difflib.get_close_matches(name, list(tables), n=1, cutoff=0.8)
    if close:  # a typo of a key of another table
        return f"unknown key {key!r} (did you mean {_join(tables[close[0]][0], close[0])!r}?)"
    return f"unknown key {key!r}"


@functools.cache
def _tables_of() -> dict[str, tuple[str, ...]]:
    """Every key name of the config -> the tables that hold it ("" is the top level)."""
    found: dict[str, list[str]] = {}

    def walk(cls: type[Any], path: str) -> None:
        for name, hint in typing.get_type_hints(cls).items():
            found.setdefault(name, []).append(path)
            origin = typing.get_origin(hint)
            if origin is Mapping:  # tables by name: [routes.NAME]
                hint, name = typing.get_args(hint)[1], f"{name}.NAME"
            elif origin in (types.UnionType, typing.Union):  # an optional table
                hint = next(a for a in typing.get_args(hint) if a is not type(None))
            if dataclasses.is_dataclass(hint):
                walk(typing.cast(type[Any], hint), _join(path, name))

    walk(Config, "")
    return {name: tuple(paths) for name, paths in found.items()}


def _table_name(path: str) -> str:
    return f"[{path}]" if path else "the top level"


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return " or ".join(f'"{v}"' for v in typing.get_args(hint))
    return "true or false" if hint is bool else getattr(hint, "__name__", str(hint))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# ---- the JSON Schema, for editors (`specroute config --schema`) -------------------------


def json_schema() -> dict[str, Any]:
    """config.toml's JSON Schema (draft 2020-12): types, defaults, choices, bounds and the
    fields' comments as descriptions; no key beyond those declared here."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "specroute config.toml",
        **_object_schema(Config),
    }


def _object_schema(cls: type[Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    comments = _field_comments(cls)
    properties: dict[str, Any] = {}
    required = []
    patterns, bounds = _declared(_PATTERNS, cls), _declared(_BOUNDS, cls)
    for f in dataclasses.fields(cls):
        prop = _type_schema(hints[f.name])
        if f.name in _CHOICES.get(cls, {}):
            prop["enum"] = list(_CHOICES[cls][f.name])
        if f.name in patterns:  # a list's: each item's
            prop.get("items", prop)["pattern"] = schema_pattern(patterns[f.name])
        if f.name in _POSITIVE.get(cls, ()):
            prop["exclusiveMinimum"] = 0
        if f.name in bounds:
            prop |= bounds[f.name].schema()
        if f.name == "urls":
            prop["minItems"] = 1
        if f.name == "num_speculative_tokens_per_batch_size":
            prop["items"] |= _SCHEDULE_ENTRY
        if f.default is not dataclasses.MISSING and f.default is not None:
            default = f.default
            prop["default"] = default.value if isinstance(default, enum.Enum) else default
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
        if f.name in comments:  # a table's own docstring first
            prop.setdefault("description", comments[f.name])
        properties[f.name] = prop
    schema: dict[str, Any] = {"type": "object"}
    doc = inspect.getdoc(cls) or ""
    if doc and not doc.startswith(f"{cls.__name__}("):  # not the dataclass's own signature
        schema["description"] = " ".join(doc.split("\n\n")[0].split())
    schema |= {"properties": properties, "additionalProperties": False}
    return schema | ({"required": required} if required else {}) | _ACROSS_KEYS.get(cls, {})


_SPECULATES = {"num_speculative_tokens": {"minimum": 1}, "method": {"not": {"const": "none"}}}
# [range_start, range_end, K]: batch sizes from 1, K from 0.
_SCHEDULE_ENTRY = {
    "prefixItems": [{"minimum": 1}, {"minimum": 1}, {"minimum": 0}],
    "minItems": 3,
    "maxItems": 3,
}
# The checks between keys of one table that the schema can state (a speculating route
# and one that is not; the two ways of naming the servers), beside the key-by-key ones.
_ACROSS_KEYS: dict[type[Any], dict[str, Any]] = {
    LatencyTargetConfig: {"minProperties": 1},
    SpeculativeBackendConfig: {"allOf": [{"properties": {"method": _SPECULATES["method"]}}]},
    RouteConfig: {
        "anyOf": [
            {
                "properties": {
                    "num_speculative_tokens": {"const": 0},
                    "method": {"const": "none"},
                    "num_speculative_tokens_per_batch_size": {"maxItems": 0},
                }
            },
            {"required": ["num_speculative_tokens", "method"], "properties": _SPECULATES},
        ]
    },
    Config: {
        "anyOf": [
            {
                "required": ["routes"],
                "properties": {
                    "routes": {"minProperties": 2},
                    "backends": {"properties": {"speculative": False, "baseline": False}},
                },
            },
            {
                "required": ["backends"],
                "properties": {
                    "routes": {"maxProperties": 0},
                    "backends": {"required": ["speculative", "baseline"]},
                },
            },
        ]
    },
}


def _type_schema(hint: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(hint):
        return _object_schema(typing.cast(type[Any], hint))
    origin = typing.get_origin(hint)
    if origin is Mapping:
        name, item = typing.get_args(hint)
        keys = {"pattern": schema_pattern(_ROUTE)} if name is Route else {"minLength": 1}
        return {
            "type": "object",
            "propertyNames": keys,
            "additionalProperties": _type_schema(item),
        }
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(hint))}
    if origin in (types.UnionType, typing.Union):
        members = [_type_schema(a) for a in typing.get_args(hint) if a is not type(None)]
        return members[0] if len(members) == 1 else {"anyOf": members}
    if origin is tuple:
        (item,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
        return {"type": "array", "items": _type_schema(item)}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"type": "string", "enum": [str(m.value) for m in hint]}
    if hint is Route:
        return {"type": "string", "pattern": schema_pattern(_ROUTE)}
    names = {float: "number", int: "integer", bool: "boolean", str: "string"}
    return {"type": names[hint]}


_FIELD = re.compile(r"^ {4}(\w+)\s*:")


def _field_comments(cls: type[Any]) -> dict[str, str]:
    """Each field's comment: the `#` lines just above it and the one beside it, from the
    source of the class that declares it (a base class's too)."""
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            lines = inspect.getsource(klass).splitlines()
        except (OSError, TypeError):
            continue
        block: list[str] = []
        for line in lines[1:]:
            stripped = line.strip()
            if stripped.startswith("#"):
                block.append(stripped.lstrip("#").strip())
                continue
            match = _FIELD.match(line)
            if match and match[1] in names:
                beside = line.split("  # ", 1)[1].strip() if "  # " in line else ""
                text = " ".join([*block, beside]).strip()
                if text:
                    out[match[1]] = text
            block = []
    return out
