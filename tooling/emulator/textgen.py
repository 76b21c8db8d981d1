"""Deterministic text for emulated answers, cut into tokens.

An answer is planned in full before the engine starts on it: a tuple of token
strings (their concatenation is the answer; a natural stop ends with one empty
EOS token, which counts in usage as it does in vLLM), a finish reason and a stop
reason. The engine then only decides *when* each token comes out.

The text depends only on the request and the seed, never on which server or in
what order it is asked, so the baseline and the speculative server give the same
answer to the same request, as two greedy engines serving one model do. That
keeps side-by-side comparisons fair. JSON is produced when the request asks for
json_object or json_schema (conforming to simple schemas); code or SQL when the
prompt looks like it asks for code; otherwise plain words.

A "token" here is a word piece of up to 8 characters or one punctuation mark,
with the whitespace before it. It is close enough to a BPE tokenizer on English
for timing, and it is exact for usage: the emulator counts what it emits.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .acceptance import Kind

_TOKEN = re.compile(r"\s*(?:\w{1,8}|[^\w\s])|\s+$")
EOS = ""


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_WORDS = _words(
    "the a model system request data time value result user service team order report "
    "first second other new small large simple clear useful quick common local final "
    "is are was can will should makes gives takes uses shows keeps needs runs helps "
    "and but so because while when then also often usually still only just very "
    "network cache server client policy budget window latency answer question detail "
    "people city river market garden letter morning evening story idea light road"
)
_KEYS = _words(
    "id name title status price quantity email city country tags description "
    "created_at category score active owner total notes priority"
)
_TABLES = ("orders", "customers", "invoices", "products", "events", "accounts")
_COLUMNS = ("id", "name", "total", "status", "created_at", "region", "amount", "email")


@dataclass(frozen=True)
class Plan:
    """The whole answer to one request, token by token."""

    pieces: tuple[str, ...]
    finish_reason: str  # "stop" or "length"
    stop_reason: str | None = None


def split_tokens(text: str) -> list[str]:
    """Cut text into emulator tokens; their concatenation is the text."""
    return _TOKEN.findall(text)


def count_tokens(text: str) -> int:
    """Token count of a prompt, with the same tokenizer as the answers."""
    return len(_TOKEN.findall(text))


def plan_answer(
    *,
    kind: Kind,
    json_schema: dict[str, Any] | None,
    natural_tokens: int,
    max_tokens: int,
    min_tokens: int,
    ignore_eos: bool,
    stop: list[str],
    rng: random.Random,
) -> Plan:
    """Plan an answer: JSON when json_schema is given ({} = any object), else text."""
    if json_schema is not None:
        doc = json.dumps(_value(json_schema, json_schema, rng, 0), ensure_ascii=False)
        pieces = split_tokens(doc)
        if ignore_eos or min_tokens > len(pieces):
            # Past the end of the document only whitespace keeps it valid JSON.
            pieces += ["\n"] * (
                max_tokens - len(pieces) if ignore_eos else min_tokens - len(pieces)
            )
    else:
        want = max_tokens if ignore_eos else max(natural_tokens, min_tokens)
        pieces = _text_tokens(kind, rng, min(want, max_tokens))
    if stop:
        cut = _cut_at_stop(pieces[:max_tokens], stop, min_tokens)
        if cut is not None:
            return cut
    if len(pieces) >= max_tokens or ignore_eos:
        return Plan(tuple(pieces[:max_tokens]), "length")
    return Plan((*pieces, EOS), "stop")


def _cut_at_stop(pieces: list[str], stop: list[str], min_tokens: int = 0) -> Plan | None:
    """vLLM stops at the first stop string completed after min_tokens tokens (one that
    ends within them is not looked for again) and leaves it out of the text."""
    text = "".join(pieces)
    floor = len("".join(pieces[:min_tokens])) if min_tokens > 0 else 0
    hits = []
    for s in stop:
        i = text.find(s) if s else -1
        while i >= 0 and i + len(s) <= floor:
            i = text.find(s, i + 1)
        if i >= 0:
            hits.append((i + len(s), i, s))
    if not hits:
        return None
    _, at, s = min(hits)
    out: list[str] = []
    offset = 0
    for piece in pieces:
        out.append(piece[: max(0, at - offset)])
        offset += len(piece)
        if offset >= at + len(s):
            break
    return Plan(tuple(out), "stop", s)


def _text_tokens(kind: Kind, rng: random.Random, n: int) -> list[str]:
    source = {"code": _code_lines, "structured": _prose, "chat": _prose, "creative": _prose}[kind]
    pieces: list[str] = []
    for fragment in source(rng):
        if len(pieces) >= n:
            break
        pieces += split_tokens(fragment)
    return pieces[:n]


def _prose(rng: random.Random) -> Iterator[str]:
    first = True
    while True:
        words = rng.choices(_WORDS, k=rng.randint(6, 16))
        sentence = " ".join(words).capitalize() + rng.choice(".....?!")
        yield sentence if first else " " + sentence
        first = False


def _code_lines(rng: random.Random) -> Iterator[str]:
    if rng.random() < 0.5:
        while True:
            cols = ", ".join(rng.sample(_COLUMNS, rng.randint(2, 4)))
            table, col = rng.choice(_TABLES), rng.choice(_COLUMNS)
            yield (
                f"SELECT {cols}\nFROM {table}\nWHERE {col} > {rng.randint(1, 500)}\n"
                f"ORDER BY {rng.choice(_COLUMNS)} DESC\nLIMIT {rng.randint(5, 50)};\n"
            )
    while True:
        name, arg = rng.choice(_WORDS), rng.choice(_KEYS)
        yield (
            f"def {name}_{arg}({arg}s):\n    result = []\n    for {arg} in {arg}s:\n"
            f"        if {arg}.{rng.choice(_KEYS)} > {rng.randint(0, 99)}:\n"
            f"            result.append({arg})\n    return result\n\n"
        )


def _phrase(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choices(_WORDS, k=rng.randint(lo, hi)))


def _value(schema: Any, root: dict[str, Any], rng: random.Random, depth: int) -> Any:
    """A JSON value conforming to a simple JSON schema ({} or json_object: any object)."""
    if not isinstance(schema, dict) or depth > 6:
        return _phrase(rng, 1, 3)
    if "$ref" in schema:
        return _value(_resolve(schema["$ref"], root), root, rng, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    for combinator in ("anyOf", "oneOf", "allOf"):
        options = [o for o in schema.get(combinator, []) if o.get("type") != "null"]
        if options:
            return _value(options[0], root, rng, depth + 1)
    kind = schema.get("type", "object" if depth == 0 or "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties")
        if not props:
            keys = rng.sample(_KEYS, rng.randint(4, 7))
            return {k: _any_scalar(rng) for k in keys}
        return {k: _value(v, root, rng, depth + 1) for k, v in props.items()}
    if kind == "array":
        lo, hi = schema.get("minItems", 2), schema.get("maxItems", 5)
        n = rng.randint(lo, max(lo, hi))
        return [
            _value(schema.get("items", {"type": "string"}), root, rng, depth + 1) for _ in range(n)
        ]
    if kind == "integer":
        return rng.randint(int(schema.get("minimum", 0)), int(schema.get("maximum", 1000)))
    if kind == "number":
        return round(rng.uniform(schema.get("minimum", 0.0), schema.get("maximum", 1000.0)), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _string(schema, rng)


def _string(schema: dict[str, Any], rng: random.Random) -> str:
    fmt = schema.get("format")
    if fmt == "date":
        return f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if fmt == "date-time":
        day = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        return f"{day}T{rng.randint(0, 23):02d}:00:00Z"
    if fmt == "email":
        return f"{rng.choice(_WORDS)}.{rng.choice(_WORDS)}@example.com"
    text = _phrase(rng, 1, 5)
    lo, hi = schema.get("minLength", 0), schema.get("maxLength")
    text = text.ljust(lo, "x")
    return text[:hi] if isinstance(hi, int) else text


def _any_scalar(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.5:
        return _phrase(rng, 1, 4)
    if roll < 0.7:
        return rng.randint(0, 1000)
    if roll < 0.8:
        return rng.random() < 0.5
    return [_phrase(rng, 1, 2) for _ in range(rng.randint(2, 4))]


def _resolve(ref: str, root: dict[str, Any]) -> Any:
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return node
