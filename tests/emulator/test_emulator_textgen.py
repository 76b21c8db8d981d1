"""Text planning and acceptance: the pure parts of the emulator."""

from __future__ import annotations

import json
import random
import statistics

import pytest

from tooling.emulator.acceptance import base_acceptance, classify, draw_accepted
from tooling.emulator.config import EmulatorConfig
from tooling.emulator.textgen import EOS, count_tokens, plan_answer, split_tokens


@pytest.mark.parametrize(
    "text", ["", "a", "Hello,  world!\n", "x = f(1)\n\n", "  lead", "naïve café"]
)
def test_tokens_concatenate_back(text: str) -> None:
    assert "".join(split_tokens(text)) == text
    assert count_tokens(text) == len(split_tokens(text))


def _plan(**overrides: object) -> tuple[tuple[str, ...], str]:
    args: dict[str, object] = {
        "kind": "chat", "json_schema": None, "natural_tokens": 20, "max_tokens": 100,
        "min_tokens": 0, "ignore_eos": False, "stop": [], "rng": random.Random(1),
    }  # fmt: skip
    args.update(overrides)
    plan = plan_answer(**args)  # type: ignore[arg-type]
    return plan.pieces, plan.finish_reason


def test_natural_stop_and_length() -> None:
    pieces, finish = _plan()
    assert len(pieces) == 21 and pieces[-1] == EOS and finish == "stop"
    pieces, finish = _plan(max_tokens=20)  # no room left for the EOS token
    assert len(pieces) == 20 and finish == "length"
    assert _plan(max_tokens=8)[0] == _plan()[0][:8]  # max_tokens keeps a prefix


@pytest.mark.parametrize("kind", ["chat", "code", "creative"])
def test_json_object_is_valid_json(kind: str) -> None:
    for seed in range(20):
        pieces, finish = _plan(kind=kind, json_schema={}, rng=random.Random(seed), max_tokens=4000)
        assert finish == "stop" and isinstance(json.loads("".join(pieces)), dict)


def test_json_schema_refs_combinators_and_formats() -> None:
    schema = {
        "$defs": {"item": {"type": "object", "properties": {"n": {"type": ["integer", "null"]}}}},
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {"$ref": "#/$defs/item"},
                "minItems": 2,
                "maxItems": 2,
            },
            "when": {"type": "string", "format": "date-time"},
            "kind": {"anyOf": [{"type": "null"}, {"const": "x"}]},
            "code": {"type": "string", "maxLength": 3},
        },
    }
    pieces, _ = _plan(json_schema=schema, max_tokens=4000)
    doc = json.loads("".join(pieces))
    assert len(doc["items"]) == 2 and all(isinstance(i["n"], int) for i in doc["items"])
    assert doc["kind"] == "x" and len(doc["code"]) <= 3 and doc["when"].endswith("Z")


def test_classification_and_temperature() -> None:
    c = EmulatorConfig(mode="speculative")
    assert classify(structured=True, prompt_text="a poem") == "structured"
    assert classify(structured=False, prompt_text="Write a poem") == "creative"
    assert classify(structured=False, prompt_text="SELECT name FROM users") == "code"
    assert classify(structured=False, prompt_text="how are you") == "chat"
    assert base_acceptance(c, "structured", 0) == 0.8
    assert base_acceptance(c, "code", 0) == 0.75
    assert base_acceptance(c, "chat", 0) == 0.5
    assert base_acceptance(c, "chat", 1.0) == pytest.approx(0.25)
    assert base_acceptance(c, "structured", 1.5) == pytest.approx(0.525)


def test_draw_accepted_follows_the_geometric_model() -> None:
    rng = random.Random(0)
    draws = [draw_accepted(0.8, 4, rng) for _ in range(20000)]
    expected = sum(0.8**i for i in range(1, 5))  # E[accepted] = a + a^2 + ... + a^k
    assert statistics.fmean(draws) == pytest.approx(expected, rel=0.03)
    assert max(draws) == 4 and min(draws) == 0


def test_stop_string_beyond_max_tokens_is_not_reached() -> None:
    full, _ = _plan()
    late = "".join(full[15:17])  # occurs only after token 10
    pieces, finish = _plan(stop=[late], max_tokens=10)
    assert finish == "length" and pieces == full[:10]
    pieces, finish = _plan(stop=[late])
    assert finish == "stop" and "".join(pieces) == "".join(full)[: "".join(full).find(late)]
