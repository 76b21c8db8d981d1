"""config.toml parsing: defaults, overrides, and one-line errors that name the key."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import subprocess
import sys
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from classifier import Endpoint, TokenCounter, Workload, extract_features
from classifier.guards import GuardsConfig
from classifier.router import RouterConfig
from classifier.types import Route
from gateway.addresses import BASE_URL, schema_pattern
from gateway.cli import resolve_config
from gateway.config import (
    Config,
    ConfigError,
    Pairing,
    config_warnings,
    json_schema,
    load_config,
    parse_config,
)
from gateway.profiling.lifecycle import targets as profile_targets

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = {"speculative": {"urls": ["http://a:1"]}, "baseline": {"urls": ["http://b:2/v1/"]}}


def test_shipped_config_toml_is_valid() -> None:
    config = load_config(ROOT / "config.toml")
    assert config.backends.speculative.urls == ("http://127.0.0.1:8001",)
    assert config.routing.tuning.rules.default_route is None  # the first speculative route
    assert config.routing.guards == GuardsConfig(spec_max_inflight=None, spec_max_kv_usage=0.9)


def test_urls_are_normalised_with_or_without_v1() -> None:
    config = parse_config({"backends": BACKENDS})
    assert config.backends.baseline.urls == ("http://b:2",)
    assert config.server.port == 8080  # defaults fill the rest


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"backends": BACKENDS, "server": {"prot": 1}}, "unknown key 'server.prot'"),
        ({"backends": BACKENDS, "colour": "blue"}, "unknown key 'colour'"),
        ({"backends": BACKENDS, "server": {"port": "80"}}, "server.port must be an integer"),
        ({"backends": BACKENDS, "server": {"port": 0}}, "server.port must be > 0"),
        ({"backends": BACKENDS, "server": {"port": True}}, "server.port must be an integer"),
        (
            {"backends": BACKENDS, "routing": {"tuning": {"rules": {"default_route": "fast"}}}},
            "routing.tuning.rules.default_route must be one of speculative, baseline",
        ),
        ({"backends": BACKENDS, "routing": {"policy": "magic"}}, "routing.policy must be one of"),
        (
            {"backends": BACKENDS, "upstream": {"read_timeout_s": -1}},
            "upstream.read_timeout_s must be > 0",
        ),
        (
            {"backends": {"speculative": {"urls": ["ftp://x"]}, "baseline": BACKENDS["baseline"]}},
            "is not an http(s) URL",
        ),
        (
            {"backends": {"speculative": BACKENDS["speculative"]}},
            "no servers: want [routes.NAME] tables",
        ),
        (
            {"backends": {"speculative": {"urls": []}, "baseline": BACKENDS["baseline"]}},
            "backends.speculative.urls must list at least one URL",
        ),
        ({"backends": BACKENDS, "server": []}, "server must be a table"),
    ],
)
def test_bad_config_fails_with_the_key_named(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(raw)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {
                "backends": {
                    **BACKENDS,
                    "baseline": {"urls": ["http://b"], "num_speculative_tokens": 4},
                }
            },
            "config: unknown key 'backends.baseline.num_speculative_tokens': it belongs in [routes.NAME] or [backends.speculative], not [backends.baseline]",
        ),
        (
            {"backends": {**BACKENDS, "baseline": {"urls": ["http://b"], "draft_cost_ratio": 0.1}}},
            "config: unknown key 'backends.baseline.draft_cost_ratio': it belongs in [routes.NAME] or [backends.speculative], not [backends.baseline]",
        ),
        (
            {"backends": BACKENDS, "routing": {"explore_max_regret": 0.1}},
            "config: unknown key 'routing.explore_max_regret': it belongs in [routing.tuning], not [routing] (docs/tuning.md)",
        ),
        (
            {"backends": BACKENDS, "routing": {"default_temperature": 0.7}},
            "config: unknown key 'routing.default_temperature': it belongs in [routing.tuning], not [routing] (docs/tuning.md)",
        ),
        (
            {"backends": BACKENDS, "routing": {"cost_model": {"explore_share": 0.1}}},
            "config: unknown key 'routing.cost_model'",
        ),
    ],
)
def test_a_key_a_route_or_table_ignores_is_an_error(raw: dict[str, object], message: str) -> None:
    """A key that would be accepted and silently ignored is refused, naming where it lives."""
    with pytest.raises(ConfigError) as exc:
        parse_config(raw)
    assert str(exc.value) == message


def test_the_tuning_table_overrides_the_defaults_in_code() -> None:
    cfg = parse_config(
        {
            "backends": BACKENDS,
            "routing": {"tuning": {"prior_sd": 0.3, "rules": {"prefill_ratio": 4.0}}},
        }
    )
    assert cfg.routing.tuning.prior_sd == 0.3
    assert cfg.routing.tuning.rules.prefill_ratio == 4.0
    assert cfg.routing.tuning.explore_max_regret == RouterConfig().explore_max_regret
    with pytest.raises(ConfigError, match="prior_sd"):
        parse_config({"backends": BACKENDS, "routing": {"tuning": {"prior_sd": 0.9}}})


@pytest.mark.parametrize("key", ["switch_margin", "move_horizon_lives"])
def test_a_retired_tuning_key_says_why_it_went(key: str) -> None:
    """The carrier's two knobs went with it (one cost model): said, not "unknown"."""
    with pytest.raises(ConfigError, match=f"key 'routing.tuning.{key}' was retired: .*remove it"):
        parse_config({"backends": BACKENDS, "routing": {"tuning": {key: 0.1}}})


@pytest.mark.parametrize(
    ("guards", "key"),
    [
        ({"spec_max_inflight": 0}, "spec_max_inflight must be >= 1"),
        ({"spec_max_inflight": -3}, "spec_max_inflight must be >= 1"),
        ({"spec_max_kv_usage": 0.0}, "spec_max_kv_usage must be within (0, 1]"),
        ({"spec_max_kv_usage": 1.5}, "spec_max_kv_usage must be within (0, 1]"),
        ({"spec_max_kv_usage": "high"}, "routing.guards.spec_max_kv_usage must be a number"),
    ],
)
def test_guards_are_validated_with_the_key_named(guards: dict[str, object], key: str) -> None:
    """The cost model's copies of the guards used to be read without any check."""
    with pytest.raises(ConfigError) as exc:
        parse_config({"backends": BACKENDS, "routing": {"guards": guards}})
    assert "routing.guards" in str(exc.value) and key in str(exc.value)


def test_creative_threshold_reaches_feature_extraction(tokens: TokenCounter) -> None:
    """routing.tuning.creative_min_temperature sets the workload every policy sees (it was
    read by the rules' temperature rule only; extract_features kept its default)."""

    def workload(threshold: float) -> Workload:
        config = parse_config(
            {"backends": BACKENDS, "routing": {"tuning": {"creative_min_temperature": threshold}}}
        )
        body = {"messages": [{"role": "user", "content": "A poem"}], "temperature": 1.2}
        return extract_features(body, Endpoint.CHAT, tokens, config.routing.features).workload

    assert workload(1.5) is Workload.CHAT
    assert workload(1.0) is Workload.CREATIVE
    with pytest.raises(
        ConfigError, match=r"routing\.tuning\.creative_min_temperature must be >= 0"
    ):
        parse_config(
            {"backends": BACKENDS, "routing": {"tuning": {"creative_min_temperature": -1}}}
        )


def test_bad_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[server\nport = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)


def test_command_line_overrides_the_file() -> None:
    config = resolve_config(
        ROOT / "config.toml", "0.0.0.0", 9999, ["baseline=http://127.0.0.1:7000/v1"]
    )
    assert (config.server.host, config.server.port) == ("0.0.0.0", 9999)
    assert config.routes[Route.BASELINE].urls == ("http://127.0.0.1:7000",)
    assert config.routes[Route.SPECULATIVE].urls == ("http://127.0.0.1:8001",)


def test_backends_alone_are_enough_without_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = resolve_config(None, None, None, ["speculative=http://s:1", "baseline=http://b:2"])
    assert config.routes[Route.SPECULATIVE].urls == ("http://s:1",)


def test_serve_with_a_bad_config_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[backends.speculative]\nurls = ["http://a:1"]\n[backends.baseline]\nurls = ["http://b:1"]\n[server]\nhots = "x"\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "specroute: config: unknown key 'server.hots' (did you mean 'server.host'?)"
    )


def test_pairs_default_to_one_pair_of_every_url() -> None:
    """Without backends.pairs the gateway does what it always did: all URLs of both
    routes are one pair (one GPU, or not said)."""
    two_each = {
        "speculative": {"urls": ["http://s0:1", "http://s1:1"]},
        "baseline": {"urls": ["http://b0:2", "http://b1:2", "http://b2:2"]},
    }
    assert parse_config({"backends": two_each}).backends.pairs is Pairing.ONE
    by_index = {**BACKENDS, "pairs": "by-index"}
    assert parse_config({"backends": by_index}).backends.pairs is Pairing.BY_INDEX


@pytest.mark.parametrize(
    ("backends", "message"),
    [
        (
            {
                "pairs": "by-index",
                "speculative": {"urls": ["http://s0:1", "http://s1:1"]},
                "baseline": {"urls": ["http://b0:2", "http://b1:2", "http://b2:2"]},
            },
            'backends.pairs = "by-index" groups the routes\' URLs by position, so it'
            " needs as many for each route: got speculative 2, baseline 3",
        ),
        ({**BACKENDS, "pairs": "per-gpu"}, "backends.pairs must be one of one, by-index"),
    ],
)
def test_bad_pairs_fail_with_the_counts_named(backends: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config({"backends": backends})
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_command_line_backend_cannot_unpair_the_file(tmp_path: Path) -> None:
    """--backend replaces a route's URLs with one: against a file's two pairs by index,
    a config error, not a gateway that pairs by position what is no longer paired."""
    path = tmp_path / "pairs.toml"
    path.write_text(
        '[backends]\npairs = "by-index"\n'
        '[backends.speculative]\nurls = ["http://s0:1", "http://s1:1"]\n'
        '[backends.baseline]\nurls = ["http://b0:2", "http://b1:2"]\n'
    )
    assert load_config(path).backends.pairs is Pairing.BY_INDEX
    with pytest.raises(ConfigError, match=r"got speculative 1, baseline 2"):
        resolve_config(path, None, None, ["speculative=http://s:1"])


# ---- what a hostile file holds: one line, never a traceback (at start and on SIGHUP) ----


def _table(hint: Any) -> Any:
    """An optional table's own type (`X | None` -> X); a [routes.NAME]'s, as "a"."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (types.UnionType, typing.Union) and len(args) == 1:
        return args[0]
    return hint


def _float_keys(cls: type[Any], path: str = "") -> list[str]:
    """Every float key of the config, however deep (the router's tuning included); the
    [routes.NAME] tables' are [backends.speculative]'s (the same class, one check)."""
    keys = []
    for name, hint in typing.get_type_hints(cls).items():
        key = f"{path}.{name}" if path else name
        hint = _table(hint)
        if typing.get_origin(hint) is Mapping:
            continue
        if dataclasses.is_dataclass(hint):
            keys += _float_keys(typing.cast(type[Any], hint), key)
        elif float in (hint, *typing.get_args(hint)):
            keys.append(key)
    return keys


def _nested(key: str, value: object) -> dict[str, Any]:
    """{"a": {"b": value}} for "a.b", merged into a config that is valid without it."""
    raw: dict[str, Any] = copy.deepcopy({"backends": BACKENDS})
    *tables, leaf = key.split(".")
    table = raw
    for name in tables:
        table = table.setdefault(name, {})
    table[leaf] = value
    return raw


FLOAT_KEYS = _float_keys(Config)


def test_the_float_keys_are_found() -> None:
    assert {"server.drain_s", "upstream.read_timeout_s", "routing.tuning.prior_sd"} <= set(
        FLOAT_KEYS
    )
    assert "backends.speculative.draft_cost_ratio" in FLOAT_KEYS


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, 10**400], ids=["nan", "inf", "-inf", "1e400"]
)
def test_every_float_key_refuses_nan_and_infinities_by_name(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(_nested(key, value))
    assert str(exc.value).startswith(f"config: {key} must be a finite number, got ")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[server]\ndrain_s = nan\n", "config: server.drain_s must be a finite number, got nan"),
        (
            "[upstream]\nread_timeout_s = 1e400\n",
            "config: upstream.read_timeout_s must be a finite number, got inf",
        ),
        ("[server]\nhost = '\xff'\n", "is not valid TOML: 'utf-8' codec can't decode byte 0xff"),
        ("[server]\nport = " + "9" * 5000 + "\n", "is not valid TOML: Exceeds the limit"),
        ("x = " + "[" * 50_000 + "]" * 50_000 + "\n", "is not valid TOML: maximum recursion"),
    ],
)
def test_a_config_file_of_any_content_is_one_line(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "c.toml"
    backends = '[backends.speculative]\nurls = ["http://a:1"]\n[backends.baseline]\nurls = ["http://b:1"]\n'
    path.write_bytes((backends + toml).encode("latin-1"))  # \xff: one byte, not UTF-8
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def assert_one_line_per_problem(message: str) -> None:
    """One problem: one line. Several: their count, then one "  - " line each."""
    first, *rest = message.split("\n")
    assert first.startswith("config: ")
    if rest:
        assert first == f"config: {len(rest)} errors:", message
        assert all(line.startswith("  - ") for line in rest), message


toml_values = st.recursive(
    st.one_of(
        st.booleans(),
        st.floats(),
        st.integers(min_value=-(2**1100), max_value=2**1100),
        st.text(max_size=10),
        st.datetimes(),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
SHIPPED = tomllib.loads((ROOT / "config.toml").read_text())


def _config_keys(raw: dict[str, Any], path: str = "") -> list[str]:
    keys = []
    for name, value in raw.items():
        key = f"{path}.{name}" if path else name
        keys.append(key)
        if isinstance(value, dict):
            keys += _config_keys(value, key)
    return keys


@settings(max_examples=150, deadline=None)
@given(
    key=st.sampled_from([*_config_keys(SHIPPED), *FLOAT_KEYS, "routing.tuning.rules.nope"]),
    value=toml_values,
)
def test_any_value_of_any_key_is_a_config_or_one_line(key: str, value: object) -> None:
    raw = copy.deepcopy(SHIPPED)
    *tables, leaf = key.split(".")
    table = raw
    for name in tables:
        table = table.setdefault(name, {}) if isinstance(table.get(name, {}), dict) else {}
    table[leaf] = value
    try:
        config = parse_config(raw)
    except ConfigError as exc:
        assert_one_line_per_problem(str(exc))
        return
    for key in FLOAT_KEYS:
        assert math.isfinite(functools.reduce(getattr, key.split("."), config)), key


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=200))
def test_any_bytes_are_a_config_or_one_line(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = tmp_path_factory.mktemp("config") / "c.toml"
    path.write_bytes(data)
    try:
        load_config(path)
    except ConfigError as exc:
        assert_one_line_per_problem(str(exc))


# ---- every problem at once, with the fix: did you mean, the right table, the list ----

SEVERAL_WRONG = """\
[backends.speculative]
urls = "http://127.0.0.1:8001"
[backends.baseline]
urls = ["http://127.0.0.1:8002"]
[server]
prot = 8080
drain_s = -1
[routing]
polciy = "rules"
prior_sd = 0.1
[logging]
level = "verbose"
"""


def test_a_file_with_several_wrong_keys_reports_every_one(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(SEVERAL_WRONG)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(exc.value) == (
        "config: 6 errors:\n"
        '  - backends.speculative.urls must be a list, not a string: urls = ["http://127.0.0.1:8001"]\n'
        "  - unknown key 'server.prot' (did you mean 'server.port'?)\n"
        "  - server.drain_s must be > 0, got -1.0\n"
        "  - unknown key 'routing.polciy' (did you mean 'routing.policy'?)\n"
        "  - unknown key 'routing.prior_sd': it belongs in [routing.tuning], not [routing] (docs/tuning.md)\n"
        "  - logging.level must be one of debug, info, warning, error, got 'verbose'"
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"backends": {**BACKENDS, "speculative": {"urls": "http://a:1/v1"}}},
            'config: backends.speculative.urls must be a list, not a string: urls = ["http://a:1/v1"]',
        ),
        (
            {"backends": {**BACKENDS, "baseline": {"urls": 'http://b:2/"x"'}}},
            'config: backends.baseline.urls must be a list, not a string: urls = ["http://b:2/\\"x\\""]',
        ),
    ],
)
def test_a_string_where_a_list_is_meant_is_refused_with_the_fix(
    raw: dict[str, Any], message: str
) -> None:
    """It was taken as a list of one: the fix shown is valid TOML for the same value."""
    with pytest.raises(ConfigError) as exc:
        parse_config(raw)
    assert str(exc.value) == message
    fix = message.split(": ", 2)[2]
    assert tomllib.loads(fix)["urls"] == [raw["backends"][message.split(".")[1]]["urls"]]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"backends": BACKENDS, "guards": {"spec_max_kv_usage": 0.8}},
            "config: unknown key 'guards': it belongs in [routing] (as [routing.guards]), not the top level",
        ),
        (
            {"backends": BACKENDS, "routing": {"spec_max_kv_usage": 0.8}},
            "config: unknown key 'routing.spec_max_kv_usage': it belongs in [routing.guards], not [routing]",
        ),
        (
            {"backends": BACKENDS, "server": {"connect_timeout_s": 1.0}},
            "config: unknown key 'server.connect_timeout_s': it belongs in [upstream], not [server]",
        ),
        (
            {"backends": BACKENDS, "server": {"max_inflight": 8}},
            "config: unknown key 'server.max_inflight': it belongs in [routes.NAME] or [backends.speculative] or"
            " [backends.baseline] or [shadow], not [server]",
        ),
        (
            {"backends": BACKENDS, "routing": {"tuning": {"prefill_ratio": 4.0}}},
            "config: unknown key 'routing.tuning.prefill_ratio': it belongs in"
            " [routing.tuning.rules], not [routing.tuning] (docs/tuning.md)",
        ),
        (
            {"backends": BACKENDS, "upstream": {"explore_max_regrett": 0.1}},
            "config: unknown key 'upstream.explore_max_regrett' (did you mean 'routing.tuning.explore_max_regret'?)",
        ),
        (
            {"backends": {**BACKENDS, "pairs": "by_index"}},
            "config: backends.pairs must be one of one, by-index, got 'by_index' (did you mean 'by-index'?)",
        ),
    ],
)
def test_a_key_in_the_wrong_table_names_the_right_one(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(raw)
    assert str(exc.value) == message


def test_a_table_that_fails_does_not_hide_its_siblings_problems() -> None:
    """A bad value keeps its default so the table's other checks still run, and a table
    that cannot be built (no urls) still lets the other tables be read."""
    raw = {
        "backends": {"speculative": {"urls": ["http://a:1"]}, "baseline": {}},
        "server": {"port": "80", "keepalive_s": 0},
        "shadow": {"share": 2.0},
    }
    with pytest.raises(ConfigError) as exc:
        parse_config(raw)
    assert str(exc.value).splitlines()[1:] == [
        "  - missing key 'backends.baseline.urls'",
        "  - server.port must be an integer, got '80'",
        "  - server.keepalive_s must be > 0, got 0.0",
        "  - shadow.share must be within [0, 1], got 2.0",
    ]


# ---- the JSON Schema (`specroute config --schema`) ----


@pytest.fixture(scope="module")
def validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _leaf_keys(cls: Any, path: str = "") -> set[str]:
    keys: set[str] = set()
    for name, hint in typing.get_type_hints(cls).items():
        key = f"{path}.{name}" if path else name
        hint = _table(hint)
        if typing.get_origin(hint) is Mapping:  # [routes.NAME]
            hint, key = typing.get_args(hint)[1], f"{key}.NAME"
        keys |= _leaf_keys(hint, key) if dataclasses.is_dataclass(hint) else {key}
    return keys


def _schema_keys(schema: dict[str, Any], path: str = "") -> set[str]:
    keys: set[str] = set()
    for name, prop in schema["properties"].items():
        key = f"{path}.{name}" if path else name
        if (
            prop.get("type") == "object"
            and "additionalProperties" in prop
            and ("properties" not in prop)
        ):  # tables by name
            prop, key = prop["additionalProperties"], f"{key}.NAME"
        keys |= _schema_keys(prop, key) if prop.get("type") == "object" else {key}
    return keys


def test_the_schema_accepts_the_shipped_config_and_every_key(validator: Any) -> None:
    assert not list(validator.iter_errors(SHIPPED))
    assert _schema_keys(json_schema()) == _leaf_keys(Config)


def test_the_schema_refuses_what_the_loader_refuses(validator: Any) -> None:
    bad = tomllib.loads(SEVERAL_WRONG)
    found = {(e.json_path, e.validator) for e in validator.iter_errors(bad)}
    assert found == {
        ("$.backends.speculative.urls", "type"),
        ("$.server", "additionalProperties"),
        ("$.server.drain_s", "exclusiveMinimum"),
        ("$.routing", "additionalProperties"),
        ("$.logging.level", "enum"),
    }


def test_the_schema_has_types_defaults_choices_and_descriptions() -> None:
    schema = json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    server = schema["properties"]["server"]
    assert server["additionalProperties"] is False
    assert server["properties"]["port"] == {
        "type": "integer",
        "exclusiveMinimum": 0,
        "maximum": 65535,
        "default": 8080,
    }
    assert "SIGTERM" in server["properties"]["drain_s"]["description"]
    routing = schema["properties"]["routing"]["properties"]
    assert routing["policy"]["pattern"] == (
        r"^(?:profiled|rules|static-[a-z0-9][a-z0-9_-]{0,62})(?![\s\S])"
    )
    assert routing["profile_path"]["description"].startswith("the profile's JSON file")
    tuning = routing["tuning"]["properties"]
    assert "benchmarks/real_routes.py" in tuning["probe_weight"]["description"]
    assert tuning["rules"]["properties"]["default_route"]["pattern"].startswith("^(?:[a-z0-9]")
    routes = schema["properties"]["routes"]["additionalProperties"]["properties"]
    assert routes["method"]["default"] == "none"
    urls = schema["properties"]["backends"]["properties"]["speculative"]["properties"]["urls"]
    assert urls == {
        "type": "array",
        "items": {"type": "string", "pattern": schema_pattern(BASE_URL)},
        "minItems": 1,
    }


# ---- several speculation configurations: [routes.NAME] ----------------------------------


def _shipped_routes_example() -> str:
    """The [routes.NAME] example config.toml carries in its comments, uncommented."""
    lines = (ROOT / "config.toml").read_text().splitlines()
    start = lines.index("#   [routes.none]")
    block = []
    for line in lines[start:]:
        if not line.startswith("#   "):
            break
        block.append(line.removeprefix("#   "))
    return "\n".join(block) + "\n"


def test_the_shipped_routes_example_is_a_valid_config() -> None:
    config = parse_config(tomllib.loads(_shipped_routes_example()))
    assert list(config.routes) == ["none", "eagle3-k3", "ngram-k8"]  # the file's order
    specs = {s.name: (s.method, s.k) for s in config.route_specs}
    assert specs == {"none": ("none", 0), "eagle3-k3": ("eagle3", 3), "ngram-k8": ("ngram", 8)}
    assert config.routes[Route("eagle3-k3")].draft_cost_ratio == 0.05


def test_two_route_tables_are_the_two_entry_case() -> None:
    legacy = parse_config({"backends": BACKENDS})
    named = parse_config(
        {
            "routes": {
                "speculative": {
                    **BACKENDS["speculative"],
                    "method": "draft_model",
                    "num_speculative_tokens": 4,
                    "draft_cost_ratio": 0.1,
                },
                "baseline": BACKENDS["baseline"],
            }
        }
    )
    assert legacy.routes == named.routes and legacy.route_specs == named.route_specs


THREE = {
    "none": {"urls": ["http://n:1"]},
    "ngram-k2": {"urls": ["http://a:1"], "method": "ngram", "num_speculative_tokens": 2},
    "ngram-k4": {"urls": ["http://b:1"], "method": "ngram", "num_speculative_tokens": 4},
}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"routes": THREE, "backends": BACKENDS}, "name the servers twice"),
        ({"routes": {"none": THREE["none"]}}, "want two routes or more, got 1 (none)"),
        ({"routes": {**THREE, "Big": THREE["none"]}}, "[routes.Big]: a route's name is"),
        (
            {"routes": {**THREE, "x": {"urls": ["http://x:1"], "method": "ngram"}}},
            "routes.x.num_speculative_tokens = 0 with routes.x.method = 'ngram'",
        ),
        (
            {"routes": THREE, "routing": {"policy": "static-ngram-k3"}},
            "routing.policy must be one of profiled, rules, static-none, static-ngram-k2,"
            " static-ngram-k4, got 'static-ngram-k3' (did you mean 'static-ngram-k4'?)",
        ),
        (
            {
                "routes": {k: THREE[k] for k in ("ngram-k2", "ngram-k4")},
                "routing": {"policy": "rules"},
            },
            'routing.policy = "rules" wants a route with speculation and one without',
        ),
        (
            {
                "routes": {**THREE, "none": {"urls": ["http://n:1", "http://n:2"]}},
                "backends": {"pairs": "by-index"},
            },
            "got none 2, ngram-k2 1, ngram-k4 1",
        ),
        ({"routes": {**THREE, "a": {"url": "http://a"}}}, "unknown key 'routes.a.url'"),
        (
            {"routes": {**THREE, "none": {**THREE["none"], "device": "gpu0"}}},
            "device: set on every route or on none (the routes without one would share"
            " which device?): unset on ngram-k2, ngram-k4",
        ),
    ],
)
def test_bad_routes_fail_with_the_route_named(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(raw)
    assert message in str(exc.value)


def _dynamic(schedule: object, k: int = 4, method: str = "eagle") -> dict[str, Any]:
    table = {"urls": ["http://d:1"], "method": method, "num_speculative_tokens": k}
    return {
        "routes": {**THREE, "dyn": {**table, "num_speculative_tokens_per_batch_size": schedule}}
    }


def test_a_dynamic_route_takes_vllms_schedule_and_the_policy_its_k_by_batch() -> None:
    """vLLM's own key and shape ([range_start, range_end, K], inclusive; sorted as vLLM
    sorts it); [] is static, as vLLM's scheduler takes it."""
    config = parse_config(_dynamic([[17, 256, 0], [1, 4, 4], [5, 16, 2]]))
    spec = config.route_specs[-1]
    assert spec.k == 4 and spec.k_by_batch == ((1, 4, 4), (5, 16, 2), (17, 256, 0))
    assert [spec.k_at(b) for b in (1, 4, 5, 16, 17, 300)] == [4, 4, 2, 2, 0, 0]
    assert parse_config(_dynamic([])).route_specs[-1].k_by_batch == ()
    assert all(s.k_by_batch == () for s in parse_config({"routes": THREE}).route_specs)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (_dynamic([[1, 4, 5]]), "K <= k (a K above num_speculative_tokens = 4, its most)"),
        (_dynamic([[2, 8, 1]]), "The first batch-size range must start at 1"),
        (_dynamic([[1, 8, 2], [4, 9, 1]]), "must be non-overlapping"),
        (_dynamic([[1, 8, 2], [9, 7, 1]]), "start must be <= end"),
        (_dynamic([[0, 8, 2]]), "want batch sizes >= 1 and K >= 0 in each entry, got [0, 8, 2]"),
        (_dynamic([[1, 8, -1]]), "got [1, 8, -1]"),
        (_dynamic([[1, 8]]), "must be lists of 3 items, got [1, 8]"),
        (_dynamic([4, 2]), "must be lists of 3 items, got 4"),
        (_dynamic([[1, 8, 1.5]]), "must be an integer, got 1.5"),
        (_dynamic({"1": 4}), "num_speculative_tokens_per_batch_size must be a list"),
        (_dynamic([[1, 8, 0]], 0, "none"), "a route without speculation proposes no K"),
        (
            {
                "backends": {
                    **BACKENDS,
                    "speculative": {
                        **BACKENDS["speculative"],
                        "num_speculative_tokens_per_batch_size": [[1, 8, 2]],
                    },
                }
            },
            "unknown key 'backends.speculative.num_speculative_tokens_per_batch_size'",
        ),
        (
            _dynamic([[1, 8, 2]])
            | {
                "routes": {
                    **THREE,
                    "dyn": {
                        "urls": ["http://d:1"],
                        "method": "eagle",
                        "num_speculative_tokens": 4,
                        "num_speculative_token_per_batch_size": [],
                    },
                }
            },
            "did you mean 'routes.dyn.num_speculative_tokens_per_batch_size'",
        ),
    ],
)
def test_a_bad_k_schedule_is_refused_naming_the_rule(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(raw)
    assert message in str(exc.value)


def test_routes_say_which_share_a_device_and_the_profile_is_told() -> None:
    devices = {"none": "core1", "ngram-k2": "core1", "ngram-k4": "core0"}
    config = parse_config(
        {"routes": {name: {**table, "device": devices[name]} for name, table in THREE.items()}}
    )
    assert {r: c.device for r, c in config.routes.items()} == devices
    assert {t.name: t.device for t in profile_targets(config)} == devices
    assert {c.device for c in parse_config({"routes": THREE}).routes.values()} == {""}


def test_the_command_line_replaces_a_named_routes_url(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(_shipped_routes_example())
    config = resolve_config(path, None, None, ["ngram-k8=http://127.0.0.1:9/v1"])
    assert config.routes[Route("ngram-k8")].urls == ("http://127.0.0.1:9",)
    assert config.routes[Route("none")].urls == ("http://127.0.0.1:8002",)
    with pytest.raises(ConfigError, match=r"--backend speculative: not a route \(none, eagle3"):
        resolve_config(path, None, None, ["speculative=http://127.0.0.1:9"])


# ---- names and addresses: matched whole, one line each (issue 50, rows e and j) ----


def test_a_route_name_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    """`$` let "spec\\n" through; its header then failed every answer with a 500."""
    path = tmp_path / "c.toml"
    path.write_text(
        '[routes."spec\\n"]\nurls = ["http://a:1"]\nmethod = "ngram"\nnum_speculative_tokens = 2\n'
        '[routes.none]\nurls = ["http://b:1"]\n'
    )
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(exc.value) == (
        'config: [routes."spec\\n"]: a route\'s name is [a-z0-9][a-z0-9_-]*, at most 63 characters'
    )
    rules = {"tuning": {"rules": {"default_route": "none\n"}}}
    with pytest.raises(ConfigError, match="default_route must be a route's name"):
        parse_config({"routes": THREE, "routing": rules})


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://127.0.0.1:99999", "has a bad port: want 1-65535 in ASCII digits"),
        ("http://127.0.0.1:abc", "has a bad port"),
        ("http://127.0.0.1:0", "has a bad port"),
        ("http://127.0.0.1:\uff18\uff10", "has a bad port"),  # full-width digits
        ("http://127.0.0.1:8001\r\nX-Evil: 1", "has a space or a control character"),
        ("http://127.0.0.1 :8001", "has a space or a control character"),
        ("http://127.0.0.1:8001/v1?x=1", "has a ?query or #fragment"),
        ("http://127.0.0.1:8001#top", "has a ?query or #fragment"),
        ("http://999.1.1.1:8001", "has no valid host name or IP address"),
        ("http://:8001", "has no valid host name or IP address"),
        ("http://[::1:8001", "has no valid host name or IP address"),
        ("ftp://x", "is not an http(s) URL"),
        ("127.0.0.1:8001", "is not an http(s) URL"),
        ("http://a:1/b c", "has a space or a control character"),
        ("http://a:1/%zz", "is not a base URL"),
    ],
)
def test_a_bad_url_is_one_line_naming_the_key(url: str, problem: str) -> None:
    routes = {**THREE, "none": {"urls": [url]}}
    with pytest.raises(ConfigError) as exc:
        parse_config({"routes": routes})
    assert str(exc.value).startswith(f"config: routes.none.urls: {url!r} {problem}")
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://user:pw@vllm:8000/v1", "http://user:pw@vllm:8000"),
        ("https://[::1]:8443/", "https://[::1]:8443"),
        ("HTTP://My_Svc:80/prefix/v1", "http://My_Svc:80/prefix"),
        ("http://vllm-none", "http://vllm-none"),
    ],
)
def test_good_urls_keep_their_host_credentials_and_path(url: str, base: str) -> None:
    config = parse_config({"routes": {**THREE, "none": {"urls": [url]}}})
    assert config.routes[Route("none")].urls == (base,)


def test_one_server_twice_in_a_route_is_refused_across_routes_warned() -> None:
    twice = {**THREE, "none": {"urls": ["http://n:1", "http://N:1/"]}}
    with pytest.raises(ConfigError, match=r"routes.none.urls: a server listed twice"):
        parse_config({"routes": twice})
    spec = {"urls": ["http://u:p@n:1/v1"], "method": "ngram", "num_speculative_tokens": 4}
    shared = {**THREE, "ngram-k4": spec}
    assert config_warnings(parse_config({"routes": shared})) == [
        "routes none, ngram-k4 name the same server http://n:1"
    ]
    assert config_warnings(parse_config({"routes": THREE})) == []


@pytest.mark.parametrize("host", ["bad host", "999.1.1.1", "", "host\n", "::1%eth0", "a..b"])
def test_a_bad_listen_host_is_refused(host: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config({"backends": BACKENDS, "server": {"host": host}})
    assert str(exc.value) == f"config: server.host = {host!r}: not a host name or IP address"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "::1", "localhost", "gw.example.com"])
def test_listen_hosts_by_name_or_address_are_taken(host: str) -> None:
    assert parse_config({"backends": BACKENDS, "server": {"host": host}}).server.host == host


@pytest.mark.parametrize(
    ("section", "values", "message"),
    [
        ("server", {"port": 70000}, "server.port must be <= 65535, got 70000"),
        ("upstream", {"retry_budget_ratio": 1.5}, "upstream.retry_budget_ratio must be within"),
        ("upstream", {"retry_budget_min": -1}, "upstream.retry_budget_min must be >= 0, got -1"),
        ("record", {"sample_rate": 0.0}, "record.sample_rate must be within (0, 1], got 0.0"),
    ],
)
def test_numeric_bounds_are_one_line_with_the_value(
    section: str, values: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config({"backends": BACKENDS, section: values})
    assert str(exc.value) == f"config: {message}" or message in str(exc.value)


def test_an_outcome_log_path_with_a_nul_byte_is_one_line() -> None:
    """os.stat raises ValueError, not OSError, on a NUL byte (the schema property test
    found it): still a config error, not a traceback."""
    with pytest.raises(ConfigError, match="cannot hold a NUL byte"):
        parse_config({"backends": BACKENDS, "outcome_log": {"path": "/tmp/a\x00b"}})
