"""extract_features: every field, each structured-output form, both endpoints."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from classifier import (
    Endpoint,
    FeatureOptions,
    RequestFeatures,
    TokenCounter,
    Workload,
    extract_features,
)
from classifier.features import COMPLETIONS_DEFAULT_MAX_TOKENS

CHAT = Endpoint.CHAT
COMPLETIONS = Endpoint.COMPLETIONS


def chat(text: str = "Hi there, how are you?", **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **fields}


def feats(counter: TokenCounter, body: dict[str, Any], **options: Any) -> RequestFeatures:
    endpoint = options.pop("endpoint", CHAT)
    return extract_features(body, endpoint, counter, FeatureOptions(**options))


# --- prompt tokens -------------------------------------------------------------


def test_chat_string_content(counter: TokenCounter) -> None:
    body = {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name three rivers."},
        ]
    }
    expected = counter.count("You are terse.") + counter.count("Name three rivers.")
    assert feats(counter, body).prompt_tokens == expected


def test_chat_list_content_counts_text_parts_only(counter: TokenCounter) -> None:
    parts = [
        {"type": "text", "text": "Describe this image."},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "text", "text": "Be brief."},
        {"type": "text"},
        {"type": "text", "text": None},
        "stray string",
    ]
    body = {"messages": [{"role": "user", "content": parts}]}
    expected = counter.count("Describe this image.") + counter.count("Be brief.")
    assert feats(counter, body).prompt_tokens == expected


def test_tool_calls_without_content(counter: TokenCounter) -> None:
    args = '{"city": "Paris", "unit": "celsius"}'
    body = {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "w", "arguments": args}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "21C"},
            {"role": "assistant", "content": None},
        ]
    }
    expected = counter.count("Weather in Paris?") + counter.count(args) + counter.count("21C")
    assert feats(counter, body).prompt_tokens == expected


def test_completions_prompt_forms(counter: TokenCounter) -> None:
    def tokens(prompt: Any) -> int:
        return feats(counter, {"prompt": prompt}, endpoint=COMPLETIONS).prompt_tokens

    assert tokens("Once upon a time") == counter.count("Once upon a time")
    assert tokens(["Once upon", "a time"]) == counter.count("Once upon") + counter.count("a time")
    assert tokens([1, 2, 3, 4, 5]) == 5
    assert tokens([[1, 2, 3], [4, 5]]) == 5
    assert tokens([]) == 0
    assert tokens(None) == 0


def test_completions_prompt_is_not_read_from_messages(counter: TokenCounter) -> None:
    assert feats(counter, chat("hello"), endpoint=COMPLETIONS).prompt_tokens == 0
    assert feats(counter, {"prompt": "hello"}).prompt_tokens == 0


def test_missing_or_odd_messages_do_not_raise(counter: TokenCounter) -> None:
    bodies: list[dict[str, Any]] = [
        {},
        {"messages": []},
        {"messages": None},
        {"messages": [None, 3, "x", {}]},
    ]
    for body in bodies:
        f = feats(counter, body)
        assert f.prompt_tokens == 0
        assert f.workload is Workload.CHAT


# --- structured output -----------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
        {"response_format": {"type": "structural_tag", "structures": []}},
        {"guided_json": {"type": "object"}},
        {"guided_json": '{"type": "object"}'},
        {"guided_regex": r"\d+"},
        {"guided_grammar": "root ::= 'a'"},
        {"guided_choice": ["yes", "no"]},
        {"structured_outputs": {"json": {"type": "object"}}},
        {"structured_outputs": {"choice": ["a", "b"]}},
        {"structured_outputs": {"json_object": True}},
        {"structured_outputs": {"grammar": "root ::= 'a'", "disable_fallback": True}},
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"},
        {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
    ],
)
def test_structured_forms(counter: TokenCounter, fields: dict[str, Any]) -> None:
    for endpoint, body in ((CHAT, chat(**fields)), (COMPLETIONS, {"prompt": "x", **fields})):
        f = feats(counter, body, endpoint=endpoint)
        assert f.structured
        assert f.workload is Workload.STRUCTURED


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"response_format": {"type": "text"}},
        {"response_format": None},
        {"response_format": {}},
        {"guided_json": None, "guided_regex": None},
        {"guided_decoding_backend": "xgrammar"},
        {"structured_outputs": {}},
        {"structured_outputs": {"json": None}},
        {"structured_outputs": {"json_object": False}},
        {"structured_outputs": {"disable_any_whitespace": True, "whitespace_pattern": " "}},
        {"structured_outputs": None},
        {"tools": [], "tool_choice": "auto"},
        {"tools": None},
        {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"},
    ],
)
def test_not_structured(counter: TokenCounter, fields: dict[str, Any]) -> None:
    assert not feats(counter, chat(**fields)).structured


# --- sampling fields and defaults ------------------------------------------------------


def test_defaults(counter: TokenCounter) -> None:
    f = feats(counter, chat())
    assert f.endpoint is CHAT
    assert f.temperature == 1.0
    assert f.top_p is None
    assert f.max_tokens is None
    assert f.expected_output_tokens == 256
    assert f.stream is False
    assert f.n == 1
    assert not f.structured and not f.code_like
    assert f.workload is Workload.CHAT


def test_configured_defaults(counter: TokenCounter) -> None:
    f = feats(counter, chat(), default_temperature=0.6, default_output_tokens=100)
    assert f.temperature == 0.6
    assert f.expected_output_tokens == 100


@pytest.mark.parametrize(
    ("value", "effective"), [(None, 0.7), (0, 0.0), (0.2, 0.2), (1.5, 1.5), (True, 0.7)]
)
def test_temperature(counter: TokenCounter, value: Any, effective: float) -> None:
    f = feats(counter, chat(temperature=value), default_temperature=0.7)
    assert f.temperature == effective
    assert isinstance(f.temperature, float)


def test_sampling_fields(counter: TokenCounter) -> None:
    f = feats(counter, chat(top_p=0.9, stream=True, n=3))
    assert (f.top_p, f.stream, f.n) == (0.9, True, 3)
    assert feats(counter, chat(top_p=None, n=None, stream=None)).n == 1


@pytest.mark.parametrize(
    ("fields", "max_tokens", "expected"),
    [
        ({"max_tokens": 64}, 64, 64),
        ({"max_completion_tokens": 32}, 32, 32),
        ({"max_tokens": 64, "max_completion_tokens": 32}, 32, 32),
        ({"max_tokens": 64, "max_completion_tokens": None}, 64, 64),
        ({"max_tokens": None}, None, 256),
        ({"max_tokens": 0}, 0, 0),
    ],
)
def test_max_tokens(
    counter: TokenCounter, fields: dict[str, Any], max_tokens: int | None, expected: int
) -> None:
    f = feats(counter, chat(**fields))
    assert (f.max_tokens, f.expected_output_tokens) == (max_tokens, expected)


def test_completions_default_output_is_vllms_16(counter: TokenCounter) -> None:
    f = feats(counter, {"prompt": "Once"}, endpoint=COMPLETIONS)
    assert f.max_tokens is None
    assert f.expected_output_tokens == COMPLETIONS_DEFAULT_MAX_TOKENS == 16
    small = feats(counter, {"prompt": "Once"}, endpoint=COMPLETIONS, default_output_tokens=8)
    assert small.expected_output_tokens == 8
    given = feats(counter, {"prompt": "Once", "max_tokens": 500}, endpoint=COMPLETIONS)
    assert given.expected_output_tokens == 500


# --- code markers -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "Fix this:\n```python\nprint(1)\n```",
        "SELECT name, count(*) FROM orders GROUP BY name",
        "Write the migration: CREATE TABLE users (id int)",
        "please create table accounts with two columns",
        "def parse(line):\n    return line.split()",
        "class Parser(Base):\n    pass",
        "function add(a, b) { return a + b }",
        "const f = function (x) { return x }",
        'Return {"name": "Ada", "age": 36}',
        '{\n  "key": 1\n}',
    ],
)
def test_code_like(counter: TokenCounter, text: str) -> None:
    f = feats(counter, chat(text))
    assert f.code_like
    assert f.workload is Workload.CODE


@pytest.mark.parametrize(
    "text",
    [
        "Tell me about the function of the liver.",
        "She is a world class athlete.",
        "Select the best answer from the list below.",
        "A table for two, please.",
        "Use {curly} braces in prose.",
        "I define success differently.",
        "The function f(x) = x^2 is smooth.",
        "A malfunction (minor) was logged.",
        "SELECT " + "word " * 80 + "FROM far away",
        "FROM the team: SELECT your seat",
    ],
)
def test_prose_is_not_code(counter: TokenCounter, text: str) -> None:
    assert not feats(counter, chat(text)).code_like


def test_code_marker_in_any_part(counter: TokenCounter) -> None:
    parts = [{"type": "text", "text": "Explain:"}, {"type": "text", "text": "```\nx = 1\n```"}]
    assert feats(counter, {"messages": [{"role": "user", "content": parts}]}).code_like
    assert feats(counter, {"prompt": ["hi", "def f():"]}, endpoint=COMPLETIONS).code_like


# --- workload ----------------------------------------------------------------------------


def test_workload_precedence(counter: TokenCounter) -> None:
    long_code = "```\n" + "x = compute(y) + 1\n" * 400 + "```"
    assert counter.count(long_code) >= 2048
    json_fmt = {"response_format": {"type": "json_object"}}
    assert feats(counter, chat(long_code, **json_fmt)).workload is Workload.STRUCTURED
    assert feats(counter, chat(long_code, temperature=1.5)).workload is Workload.LONG_CONTEXT
    assert feats(counter, chat("```x```", temperature=1.5)).workload is Workload.CODE
    assert feats(counter, chat("A poem", temperature=1.2)).workload is Workload.CREATIVE
    assert feats(counter, chat("A poem", temperature=0.7)).workload is Workload.CHAT


def test_long_prompt_threshold_is_a_parameter(counter: TokenCounter) -> None:
    body = chat("one two three four five")
    n = counter.count("one two three four five")
    assert feats(counter, body, long_prompt_tokens=n).workload is Workload.LONG_CONTEXT
    assert feats(counter, body, long_prompt_tokens=n + 1).workload is Workload.CHAT


def test_creative_needs_an_explicit_temperature(counter: TokenCounter) -> None:
    """The server default (often 1.0) says nothing about the task."""
    assert feats(counter, chat("A poem")).workload is Workload.CHAT
    assert feats(counter, chat("A poem", temperature=None)).workload is Workload.CHAT
    assert feats(counter, chat("A poem", temperature=1.0)).workload is Workload.CREATIVE
    tuned = feats(counter, chat("A poem", temperature=0.9), creative_min_temperature=0.8)
    assert tuned.workload is Workload.CREATIVE


def test_label_values_are_stable() -> None:
    assert [w.value for w in Workload] == [
        "structured",
        "code",
        "creative",
        "long_context",
        "chat",
    ]
    assert [e.value for e in Endpoint] == ["chat", "completions", "responses"]


def test_features_are_frozen(counter: TokenCounter) -> None:
    f = feats(counter, chat())
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.n = 2  # type: ignore[misc]
