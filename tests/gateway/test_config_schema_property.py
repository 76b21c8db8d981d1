"""The JSON Schema (`specroute config --schema`) agrees with the loader, key by key.

Any value the loader refuses, the schema refuses, read with Python's regexes (the
jsonschema package) and with ECMA-262's (JSON Schema's own dialect: editors, regress);
and a value the loader takes, the schema takes. The checks between keys that a schema
cannot state (a policy or a default route naming a configured route, a device set on
all routes or none, by-index counts, one server listed twice) are left out by their
messages, and a key checked against the machine (outcome_log.path). TOML's numbers
JSON has not: NaN, infinities (test_config.py has them), 1.0 as a float, not an integer.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import typing
from collections.abc import Mapping
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import regress
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway import config
from gateway.addresses import IPV6
from gateway.config import Config, ConfigError, json_schema, parse_config

ROUTES = {
    "none": {"urls": ["http://n:1"]},
    "ngram-k2": {"urls": ["http://a:1"], "method": "ngram", "num_speculative_tokens": 2},
}
BACKENDS = {"speculative": {"urls": ["http://s:1"]}, "baseline": {"urls": ["http://b:1"]}}
ACROSS_KEYS = (
    "routing.policy must be one of",
    "default_route must be one of",
    'routing.policy = "rules" wants',
    "device: set on every route or on none",
    '"by-index" groups',
    "a server listed twice",
    config.SCHEDULE_ACROSS,  # a K schedule's order and its K against num_speculative_tokens
)
# JSON's numbers do not tell 1.0 from 1, so a schema's integer takes 1.0; TOML's do.
INTEGRAL_FLOAT = re.compile(r"must be an integer, got -?[0-9]+\.0$")


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    if validator.is_type(instance, "string") and regress.Regex(pattern).find(instance) is None:
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r} (ECMA-262)")


SCHEMA = json_schema()
PYTHON = jsonschema.Draft202012Validator(SCHEMA)
ECMA = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _ecma_pattern})(
    SCHEMA
)


def _leaf_keys(cls: Any, path: str = "") -> list[str]:
    keys: list[str] = []
    for name, hint in typing.get_type_hints(cls).items():
        key = f"{path}.{name}" if path else name
        if typing.get_origin(hint) in (typing.Union, type(int | None)):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        if typing.get_origin(hint) is Mapping:  # [routes.NAME]
            keys += _leaf_keys(typing.get_args(hint)[1], f"{key}.ngram-k2")
        elif dataclasses.is_dataclass(hint):
            keys += _leaf_keys(hint, key)
        else:
            keys.append(key)
    return keys


# Checked against the machine (does the log's directory exist?), not by its form.
ON_THE_MACHINE = ("outcome_log.path",)
KEYS = [k for k in _leaf_keys(Config) if k not in ON_THE_MACHINE]

_CHARS = "az09AZ_-.:/@[]%?# \n\r\t\x00\uff18\u00e9"
hosts = st.one_of(
    st.sampled_from(["h", "vllm-none", "my_svc", "127.0.0.1", "999.1.1.1", "[::1]", "::1"]),
    st.sampled_from(["[1::2::3]", "[fe80::1%eth0]", "a..b", "-a", "a-", "1.2.3", "0.0.0.0"]),
    st.text(alphabet=_CHARS, max_size=8),
)
urls = st.builds(
    lambda scheme, user, host, port, path: f"{scheme}{user}{host}{port}{path}",
    st.sampled_from(["http://", "https://", "HTTP://", "ftp://", "", "http:/"]),
    st.sampled_from(["", "u:p@", "u@", ":p@", "a b@", "u@v@"]),
    hosts,
    st.sampled_from(["", ":1", ":8000", ":65535", ":65536", ":0", ":01", ":abc", ":", ":\uff18"]),
    st.sampled_from(["", "/", "/v1", "/v1/", "/p/v1", "/a b", "/%zz", "/%41", "?q=1", "#f", "\n"]),
)
strings = st.one_of(
    st.text(alphabet=_CHARS, max_size=12),
    hosts,
    urls,
    st.sampled_from(["none", "ngram", "info", "loud", "rules", "static-none", "one"]),
)
numbers = st.one_of(
    st.integers(min_value=-3, max_value=70_000),
    st.floats(min_value=-3, max_value=70_000, allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 0.0, 0.5, 1, 1.0, 1.5, 2, 10, 10.5, 65535, 65536, 2**70]),
)
# A K schedule's entries, [range_start, range_end, K], and near misses.
schedules = st.lists(
    st.one_of(
        st.lists(st.integers(min_value=-1, max_value=9), min_size=2, max_size=4),
        st.lists(st.one_of(numbers, st.booleans()), min_size=3, max_size=3),
    ),
    max_size=3,
)
values = st.one_of(
    st.booleans(),
    numbers,
    strings,
    st.lists(st.one_of(urls, strings, numbers), max_size=3),
    schedules,
)


def _with(base: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(base)
    *tables, leaf = key.split(".")
    table = raw
    for name in tables:
        table = table.setdefault(name, {})
    table[leaf] = value
    return raw


def _loader_refuses(raw: dict[str, Any]) -> bool | None:
    """True or False; None where every problem is one the schema cannot state."""
    try:
        parse_config(raw)
    except ConfigError as exc:
        problems = [p for p in str(exc).split("\n") if not p.endswith("errors:")]
        if all(any(m in p for m in ACROSS_KEYS) or INTEGRAL_FLOAT.search(p) for p in problems):
            return None
        return True
    return False


def _assert_agree(raw: dict[str, Any]) -> None:
    refused = _loader_refuses(raw)
    if refused is None:
        return
    for validator in (PYTHON, ECMA):
        errors = [e.message for e in validator.iter_errors(raw)]
        assert bool(errors) == refused, (raw, errors)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(KEYS), value=values, form=st.sampled_from(["routes", "backends"]))
@example(key="server.port", value=65536, form="routes")
@example(key="routes.ngram-k2.urls", value=["http://127.0.0.1:99999"], form="routes")
@example(key="routes.ngram-k2.urls", value=["http://u:pw@a:1/v1"], form="routes")
@example(key="server.host", value="h\n", form="routes")
@example(
    key="routes.ngram-k2.num_speculative_tokens_per_batch_size",
    value=[[1, 8, 2], [9, 64, 0]],
    form="routes",
)
@example(
    key="routes.ngram-k2.num_speculative_tokens_per_batch_size", value=[[1, 8, 3]], form="routes"
)
@example(
    key="routes.ngram-k2.num_speculative_tokens_per_batch_size",
    value=[[1, 8, 2], [4, 9, 1]],
    form="routes",
)
@example(
    key="routes.ngram-k2.num_speculative_tokens_per_batch_size", value=[[1, 0, 2]], form="routes"
)
@example(key="routes.ngram-k2.num_speculative_tokens_per_batch_size", value=[[1, 8]], form="routes")
@example(key="routes.none.num_speculative_tokens_per_batch_size", value=[[1, 8, 0]], form="routes")
def test_any_value_of_any_key_the_loader_refuses_the_schema_refuses(
    key: str, value: Any, form: str
) -> None:
    base = {"routes": ROUTES} if form == "routes" else {"backends": BACKENDS}
    if key.startswith("routes.") and form == "backends":
        key = key.replace("routes.ngram-k2.", "backends.speculative.", 1)
    if key.startswith("backends.") and form == "routes":
        return  # [backends.speculative] beside [routes.NAME]: refused by both, said elsewhere
    _assert_agree(_with(base, key, value))


@settings(max_examples=300, deadline=None)
@given(name=st.text(alphabet="az09_-AZ.\n \u00e9", max_size=70) | st.just("spec\n"))
@example(name="a" * 63)
@example(name="a" * 64)
def test_any_route_name_the_loader_refuses_the_schema_refuses(name: str) -> None:
    _assert_agree({"routes": {**ROUTES, name: {"urls": ["http://x:1"]}}})


@pytest.mark.parametrize(
    "text",
    ["::", "::1", "1::", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "fe80::1:2"],
)
def test_the_ipv6_expression_takes_what_python_takes(text: str) -> None:
    assert re.fullmatch(IPV6, text)
    assert regress.Regex(f"^(?:{IPV6})$").find(text) is not None


def test_every_bound_and_pattern_names_a_field_of_its_table() -> None:
    """A field removed from its class (a retired key) takes its bounds with it."""
    for table in (config._BOUNDS, config._PATTERNS):
        for cls, names in table.items():
            fields = {f.name for f in dataclasses.fields(cls)}
            assert set(names) <= fields, (cls.__name__, set(names) - fields)
