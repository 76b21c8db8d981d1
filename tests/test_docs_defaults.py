"""The defaults the docs name are the code's (issue 54, "docs that cannot drift").

Read: README.md, docs/decision.md, docs/tuning.md, docs/ARCHITECTURE.md, and the pages the
README sends users to (configuration, servers, api). Held to:
gateway/config.py's frozen config dataclasses (every key, by its table) and classifier's
module constants. A doc states a default in one of these forms, and this test reads it:

- a table with a `key` column and a `default` column (a bare key is looked up under
  the `[table]` its section's heading names);
- a backticked key and then its default: `spec_max_kv_usage` (0.9),
  `drift_memory` = 100 requests, `explore_max_regret` (25%), `spec_max_inflight`
  (unset ...);
- a setting in backticks followed by "(the default)": `routing.policy = "profiled"`
  (the default). Without those words a backticked setting is an example, and only its
  key is checked;
- a classifier constant by name, in the same two ways: `TRAFFIC_MEMORY` (1000);
- a ```toml block: it must load as a config (two backends are added to a fragment that
  names none); a block with the word "defaults" in a comment gives each value's default.

A bare name given a value must be a key (or one of REQUEST_FIELDS, `max_tokens` (1)).
Wherever a doc names a key with its table (`server.port`, `[routing.guards]`,
`backends.<route>.api_key_env`), that key must exist; a retired key (gateway/config.py's
`_RETIRED`) may appear only in a sentence that says it was retired.
"""

from __future__ import annotations

import dataclasses
import enum
import fnmatch
import importlib
import math
import pkgutil
import re
import tomllib
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import classifier
from gateway.config import _RETIRED, Config, ConfigError, parse_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = (
    "README.md",
    "docs/decision.md",
    "docs/tuning.md",
    "docs/ARCHITECTURE.md",
    "docs/configuration.md",
    "docs/servers.md",
    "docs/api.md",
)
TWO_BACKENDS = {
    "speculative": {"urls": ["http://127.0.0.1:8001"]},
    "baseline": {"urls": ["http://127.0.0.1:8002"]},
}


class _Required:
    def __repr__(self) -> str:
        return "<required>"


# Fields of a request body that the docs give values for, as `max_tokens` (1): no keys.
REQUEST_FIELDS = frozenset({"max_tokens", "min_tokens", "temperature", "top_p", "n"})
REQUIRED = _Required()  # a key without a default (a route's urls)
NOT_A_VALUE = object()


# -- what the code says ------------------------------------------------------------


def _item_class(hint: Any) -> tuple[type[Any] | None, bool]:
    """The dataclass a field holds (X, X | None, or Mapping[name, X]), and whether it
    is a mapping of them."""
    origin = typing.get_origin(hint)
    if origin is Mapping:
        item: type[Any] = typing.get_args(hint)[1]
        return (item if dataclasses.is_dataclass(item) else None), True
    for arg in (hint, *typing.get_args(hint)):
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
            return arg, False
    return None, False


def _walk(cls: type[Any], prefix: str) -> Iterator[tuple[str, Any, bool]]:
    """(path, default, is a table) for every key under `cls`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        inner, mapping = _item_class(hints[f.name])
        if inner is not None:
            yield path, None, True
            table = f"{path}.*" if mapping else path
            if mapping:
                yield table, None, True
            yield from _walk(inner, table + ".")
        elif f.default is not dataclasses.MISSING:
            yield path, f.default, False
        elif f.default_factory is not dataclasses.MISSING:
            yield path, f.default_factory(), False
        else:
            yield path, REQUIRED, False


@dataclass(frozen=True)
class Code:
    keys: dict[str, Any]  # "routing.tuning.prior_sd" -> 0.2; "routes.*.method" -> "none"
    tables: frozenset[str]
    constants: dict[str, Any]  # classifier's NAME -> value

    @property
    def top(self) -> frozenset[str]:
        return frozenset(p.split(".")[0] for p in (*self.keys, *self.tables))

    def resolve(self, name: str, context: str = "") -> list[str]:
        """The key paths `name` can mean: dotted (placeholders as `*`) or bare, a bare
        one narrowed to the `context` table where that decides."""
        if name in self.tables:
            return [name]
        if "." in name:
            pattern = _pattern(name)
            return [p for p in (*self.keys, *self.tables) if _matches(pattern, p)]
        found = [p for p in self.keys if p.rsplit(".", 1)[-1] == name]
        inside = [p for p in found if context and _matches(context + ".*", p, prefix=True)]
        return inside or found


def _pattern(name: str) -> str:
    """`backends.<route>.api_key_env`, `[routes.NAME]` -> `backends.*.api_key_env`, `routes.*`."""
    parts = name.strip("[]").split(".")
    return ".".join("*" if re.fullmatch(r"<[^>]*>|[A-Z][A-Z_]*|\*", p) else p for p in parts)


def _matches(pattern: str, path: str, *, prefix: bool = False) -> bool:
    """Segment by segment, `*` standing for any one segment (a route's name included)."""
    want, have = pattern.split("."), path.split(".")
    if prefix:
        want = want[:-1]
        have = have[: len(want)]
    return len(want) == len(have) and all(
        w == "*" or h == "*" or fnmatch.fnmatchcase(h, w) for w, h in zip(want, have, strict=True)
    )


def _constants() -> dict[str, Any]:
    """classifier's module constants (`NAME` or `_NAME`, a number or a string); a name
    two modules give different values is left out, as the docs could not say which."""
    seen: dict[str, set[Any]] = {}
    for info in pkgutil.iter_modules(classifier.__path__, "classifier."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if re.fullmatch(r"_?[A-Z][A-Z0-9_]*", name) and isinstance(value, int | float | str):
                seen.setdefault(name, set()).add(value)
    return {name: next(iter(values)) for name, values in seen.items() if len(values) == 1}


def code() -> Code:
    walked = list(_walk(Config, ""))
    return Code(
        keys={p: d for p, d, table in walked if not table},
        tables=frozenset(p for p, _, table in walked if table),
        constants=_constants(),
    )


# -- what the docs say -------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    doc: str
    line: int
    key: str  # as written
    context: str  # the [table] of its section, or ""
    value: Any  # NOT_A_VALUE: only the key is claimed
    form: str  # "table" (a key/default row), "default", "setting" or "key"

    def where(self) -> str:
        return f"{self.doc}:{self.line}: `{self.key}`"


_NUMBER = re.compile(r"(-?\d[\d,_]*(?:\.\d+)?(?:e-?\d+)?)\s*(%|KiB|MiB|GiB)?(?![\w.])")
_UNITS = {None: 1, "%": 0.01, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def parse_value(text: str) -> Any:
    """A default as a doc writes it: 0.9, 25%, 4 MiB, 1,000 requests, "profiled", true,
    unset; NOT_A_VALUE for anything else."""
    text = text.strip().strip("`").strip()
    if re.match(r"unset\b", text):
        return None
    if re.fullmatch(r'""', text):
        return ""
    if string := re.match(r'"([^"]*)"', text):
        return string[1]
    if boolean := re.match(r"(true|false)\b", text):
        return boolean[1] == "true"
    if (number := _NUMBER.match(text)) is None:
        return NOT_A_VALUE
    digits, unit = number[1].replace(",", "").replace("_", ""), number[2]
    value = float(digits) * _UNITS[unit]
    return int(value) if value.is_integer() and unit is None and "." not in digits else value


_KEY = r"\[?[A-Za-z_][\w<>*-]*(?:\.[\w<>*-]+)*\]?"
_TICKED_DEFAULT = re.compile(rf"`({_KEY})`\s*(?:\(([^()]*)[()]|=\s*([^\s,;)]+(?:\s+[KMG]iB)?))")
_TICKED_SETTING = re.compile(rf"`({_KEY})\s*=\s*([^`]+)`(\s*\((?:the )?default\))?")
_TICKED_KEY = re.compile(rf"`({_KEY})`")
_HEADING = re.compile(r"^(#+)\s")
_TABLE_IN_HEADING = re.compile(r"`\[([\w.]+)\]`")
_FILE = re.compile(r"\.(py|md|toml|json|ya?ml|sh|png|txt|html|js)$")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _table_claims(doc: str, lines: list[str], contexts: list[str]) -> Iterator[Claim]:
    """Rows of every table whose header has `key` and `default` columns."""
    for i, line in enumerate(lines):
        cells = _cells(line) if line.lstrip().startswith("|") else []
        if "key" not in cells or "default" not in cells:
            continue
        k, d = cells.index("key"), cells.index("default")
        for j in range(i + 2, len(lines)):
            if not lines[j].lstrip().startswith("|"):
                break
            row = _cells(lines[j])
            key = row[k].strip("`")
            yield Claim(doc, j + 1, key, contexts[j], parse_value(row[d]), "table")


def _prose_claims(
    doc: str, lines: list[str], contexts: list[str], top: frozenset[str]
) -> Iterator[Claim]:
    """The backticked forms, read across line ends (a key may end one line and its
    default open the next); fenced blocks are left out."""
    kept, fenced = [], False
    for line in lines:
        fence = line.lstrip().startswith("```")
        fenced ^= fence
        kept.append("" if fenced or fence else line)
    text = "\n".join(kept)

    def at(m: re.Match[str], key: str) -> tuple[int, str, str]:
        i = text.count("\n", 0, m.start())
        return i + 1, key, contexts[i]

    for m in _TICKED_DEFAULT.finditer(text):
        raw = m[2] if m[2] is not None else m[3]
        yield Claim(doc, *at(m, m[1]), parse_value(raw), "default")
    for m in _TICKED_SETTING.finditer(text):
        key = m[1]
        value = parse_value(m[2]) if (m[3] or _is_constant_name(key)) else NOT_A_VALUE
        yield Claim(doc, *at(m, key), value, "setting")
    for m in _TICKED_KEY.finditer(text):  # a key named with its table
        key = m[1]
        if ("." in key and key.strip("[]").split(".")[0] in top and not _FILE.search(key)) or (
            key.startswith("[") and key.strip("[]") in top
        ):
            yield Claim(doc, *at(m, key), NOT_A_VALUE, "key")


def _is_constant_name(name: str) -> bool:
    return re.fullmatch(r"_?[A-Z][A-Z0-9_]*", name) is not None


def _contexts(lines: list[str]) -> list[str]:
    """Per line: the `[table]` the nearest heading above it (at any level) names."""
    tables: dict[int, str] = {}
    out: list[str] = []
    for line in lines:
        if heading := _HEADING.match(line):
            level = len(heading[1])
            tables = {lv: t for lv, t in tables.items() if lv < level}
            if named := _TABLE_IN_HEADING.search(line):
                tables[level] = named[1]
        out.append(tables[max(tables)] if tables else "")
    return out


def claims(doc: str, text: str, top: frozenset[str]) -> list[Claim]:
    lines = text.splitlines()
    contexts = _contexts(lines)
    return [*_table_claims(doc, lines, contexts), *_prose_claims(doc, lines, contexts, top)]


def toml_blocks(text: str) -> Iterator[tuple[int, str]]:
    """(first line, body) of every ```toml block."""
    for m in re.finditer(r"^```toml\n(.*?)^```", text, re.S | re.M):
        yield text.count("\n", 0, m.start()) + 2, m[1]


# -- the comparison ----------------------------------------------------------------


def same(doc: Any, code_value: Any) -> bool:
    if isinstance(code_value, enum.Enum):
        code_value = code_value.value
    if doc is None or code_value is None or isinstance(code_value, bool | str):
        return bool(doc == code_value and type(doc) is type(code_value))
    if isinstance(doc, bool) or not isinstance(doc, int | float):
        return False
    return isinstance(code_value, int | float) and math.isclose(doc, code_value, rel_tol=1e-9)


def check(claim: Claim, known: Code) -> str | None:
    """A problem with the claim, or None."""
    name = claim.key.strip("[]")
    if _is_constant_name(name):
        if name not in known.constants:
            # `NAME` (value) claims a constant; `NAME=value` in backticks is an
            # environment variable's setting
            return (
                f"{claim.where()} names no classifier constant (or two modules give it different values)"
                if claim.form == "default" and claim.value is not NOT_A_VALUE
                else None
            )
        if claim.value is NOT_A_VALUE or same(claim.value, known.constants[name]):
            return None
        return f"{claim.where()} is {known.constants[name]!r} in code, the doc says {claim.value!r}"
    paths = known.resolve(name, claim.context)
    if not paths:
        # a dotted name, a key column, or a bare name given a value names a key, unless
        # it is one of a request's fields
        named = (
            "." in name
            or claim.key.startswith("[")
            or claim.form == "table"
            or (claim.value is not NOT_A_VALUE and name not in REQUEST_FIELDS)
        )
        return f"{claim.where()} names no config key" if named and not _is_code(name) else None
    if claim.value is NOT_A_VALUE:
        return None
    defaults = {p: known.keys[p] for p in paths if p in known.keys}
    if not defaults:
        return f"{claim.where()} is a table, not a key with a default"
    if len({repr(d) for d in defaults.values()}) > 1:
        return f"{claim.where()} could be any of {sorted(defaults)} (their defaults differ): name its table"
    default = next(iter(defaults.values()))
    if same(claim.value, default):
        return None
    return f"{claim.where()} defaults to {default!r} in code, the doc says {claim.value!r}"


def _is_code(name: str) -> bool:
    """`auth.auth_middleware`: a module's attribute in gateway/ or classifier/, not a key."""
    first, *rest = name.split(".")
    for package in ("gateway", "classifier"):
        try:
            obj: Any = importlib.import_module(f"{package}.{first}")
        except ImportError:
            continue
        for attr in rest:
            obj = getattr(obj, attr, None)
        if obj is not None:
            return True
    return False


def problems_of(doc: str, text: str, known: Code) -> list[str]:
    out = [p for c in claims(doc, text, known.top) if (p := check(c, known)) is not None]
    out = list(dict.fromkeys(out))  # a key in two forms at one place is one problem
    for line, body in toml_blocks(text):
        out.extend(_toml_problems(f"{doc}:{line}", body, known))
    out.extend(_retired_problems(doc, text))
    return out


def _leaves(raw: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in raw.items():
        path = prefix + key
        if isinstance(value, Mapping):
            yield from _leaves(value, path + ".")
        else:
            yield path, value


def _toml_problems(where: str, body: str, known: Code) -> list[str]:
    try:
        raw = tomllib.loads(body)
    except tomllib.TOMLDecodeError as exc:
        return [f"{where}: not TOML: {exc}"]
    whole = dict(raw)
    if "routes" not in whole and not {"speculative", "baseline"} & set(whole.get("backends", {})):
        whole["backends"] = {**whole.get("backends", {}), **TWO_BACKENDS}
    try:
        parse_config(whole)
    except ConfigError as exc:
        return [f"{where}: the toml block does not load: {exc}"]
    if not re.search(r"#[^\n]*\bdefaults\b", body):
        return []
    out = []
    for path, value in _leaves(raw):
        found = (known.resolve(re.sub(r"^routes\.[^.]+\.", "routes.*.", path)) or [path])[0]
        if found not in known.keys or not same(value, known.keys[found]):
            out.append(
                f"{where}: `{path} = {value!r}` but its default is {known.keys.get(found)!r}"
            )
    return out


def _retired_problems(doc: str, text: str) -> list[str]:
    out = []
    for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z`(\[*])|\n\s*\n", text):
        for name in _RETIRED:
            if re.search(rf"\b{name}\b", sentence) and "retired" not in sentence:
                out.append(
                    f"{doc}: `{name}` is retired but documented as live: {sentence.strip()[:120]!r}"
                )
    return out


# -- the tests ---------------------------------------------------------------------


@pytest.mark.parametrize("doc", DOCS)
def test_every_default_a_doc_names_is_the_codes(doc: str) -> None:
    problems = problems_of(doc, (ROOT / doc).read_text(), code())
    assert not problems, "\n".join(problems)


def test_the_docs_name_defaults_for_this_test_to_hold() -> None:
    """A reader that finds nothing holds nothing: the tuning tables and the decision
    page's memories are read."""
    known = code()
    read = {
        doc: [
            c
            for c in claims(doc, (ROOT / doc).read_text(), known.top)
            if c.value is not NOT_A_VALUE
        ]
        for doc in DOCS
    }
    tuning = {
        known.resolve(c.key.strip("[]"), c.context)[0]
        for c in read["docs/tuning.md"]
        if not _is_constant_name(c.key)
    }
    assert {
        f"routing.tuning.{f.name}"
        for f in dataclasses.fields(Config().routing.tuning)
        if f.name != "rules"
    } <= tuning
    assert {"routing.tuning.rules.prefill_ratio", "routing.guards.spec_max_kv_usage"} <= tuning
    decision = {c.key for c in read["docs/decision.md"]}
    assert {"acceptance_memory", "drift_memory", "failure_memory", "TRAFFIC_MEMORY"} <= decision


def _known() -> Code:
    return Code(
        keys={
            "server.port": 8080,
            "routing.tuning.prior_sd": 0.2,
            "routing.tuning.explore_max_regret": 0.25,
            "routing.guards.spec_max_inflight": None,
            "shadow.max_inflight": 1,
            "routes.*.max_inflight": 256,
            "routes.*.method": "none",
        },
        tables=frozenset(
            {
                "server",
                "routing",
                "routing.tuning",
                "routing.guards",
                "shadow",
                "routes",
                "routes.*",
            }
        ),
        constants={"TRAFFIC_MEMORY": 1000.0},
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("| key | default |\n|---|---|\n| `prior_sd` | 0.3 |\n", "defaults to 0.2 in code"),
        ("| key | default |\n|---|---|\n| `switch_gain` | 0.3 |\n", "names no config key"),
        ("The bound, `explore_max_regret` (15%), holds.\n", "the doc says 0.15"),
        ("Memory `TRAFFIC_MEMORY` = 100 answers.\n", "is 1000.0 in code"),
        ("Set `server.prot = 80` to move it.\n", "names no config key"),
        ("The gain, `switch_gain` (0.3), is gone.\n", "names no config key"),
        ("`routing.tuning.prior_sd = 0.5` (the default)\n", "the doc says 0.5"),
        ("The limit (`max_inflight` (1)) applies.\n", "name its table"),
        ("The margin `switch_margin` is 15%.\n", "retired but documented as live"),
        ("```toml\n[routing.tuning]  # the defaults\nprior_sd = 0.3\n```\n", "its default is 0.2"),
        ("```toml\n[routing.tuning]\nswitch_gain = 0.3\n```\n", "does not load"),
    ],
)
def test_a_drifted_doc_fails(text: str, problem: str) -> None:
    """Each form, written wrong, is a problem; written right, none."""
    found = problems_of("doc.md", text, _known())
    assert any(problem in p for p in found), found


@pytest.mark.parametrize(
    "text",
    [
        "| key | default |\n|---|---|\n| `prior_sd` | 0.2 |\n",
        "The bound, `explore_max_regret` (25%), holds; `spec_max_inflight` (unset by default).\n",
        'Memory `TRAFFIC_MEMORY` (1000) answers; `routes.NAME.method` = "none".\n',
        "`routing.tuning.prior_sd = 0.5` sets it; `[routes.NAME]`, `shadow.max_inflight` (1).\n",
        "`switch_margin` was retired with the carrier rule.\n",
        "```toml\n[routing.tuning]  # the defaults\nprior_sd = 0.2\n```\n",
        "`max_tokens` (16) and `x-specroute-route` (pool mode) are no keys.\n",
    ],
)
def test_a_doc_that_matches_passes(text: str) -> None:
    assert problems_of("doc.md", text, _known()) == []
