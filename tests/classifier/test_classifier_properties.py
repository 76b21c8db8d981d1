"""Property tests: odd-but-valid bodies never make extraction or decisions raise."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from classifier import (
    PROFILED_REASONS,
    BackendState,
    Endpoint,
    LiveState,
    ProfiledPolicy,
    RouterConfig,
    RulesConfig,
    RulesPolicy,
    TokenCounter,
    Workload,
    extract_features,
)
from classifier.cost import prior_profile
from classifier.types import PAIR, two_routes

# database=None: keep hypothesis from writing .hypothesis/ into the repo.
SETTINGS = settings(max_examples=150, deadline=None, database=None)

REASONS = {
    "kv-pressure",
    "spec-busy",
    "high-temperature",
    "prefill-bound",
    "structured-low-temp",
    "code-low-temp",
    "default",
    "unhealthy-fallback",
}

text = st.text(st.characters(codec="utf-8") | st.sampled_from("\ud800{}`\"'\n "), max_size=60)
scalars = st.none() | st.booleans() | st.integers() | st.floats() | text
json_ish = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
part = (
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image_url", "input_audio", "refusal"]) | text},
        optional={"text": text | json_ish, "image_url": json_ish},
    )
    | json_ish
)
content = st.none() | text | st.lists(part, max_size=4) | json_ish
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"])},
    optional={
        "content": content,
        "tool_calls": st.lists(
            st.fixed_dictionaries({"function": st.dictionaries(text, json_ish, max_size=3)})
            | json_ish,
            max_size=2,
        ),
        "name": text,
    },
)
number = st.none() | st.floats() | st.integers(-(10**400), 10**400)
sampling = {
    "temperature": number,
    "top_p": number,
    "max_tokens": st.none() | st.integers(),
    "max_completion_tokens": st.none() | st.integers(),
    "n": st.none() | st.integers(),
    "stream": st.none() | st.booleans(),
    "response_format": st.none() | json_ish,
    "guided_json": json_ish,
    "guided_choice": json_ish,
    "structured_outputs": json_ish,
    "tools": st.none() | st.lists(json_ish, max_size=2),
    "tool_choice": st.none() | st.sampled_from(["none", "auto", "required"]) | json_ish,
}
chat_body = st.fixed_dictionaries({"messages": st.lists(message, max_size=5)}, optional=sampling)
prompt = st.none() | text | st.lists(text, max_size=3) | st.lists(st.integers(0, 10**6))
completions_body = st.fixed_dictionaries(
    {"prompt": prompt | st.lists(st.lists(st.integers(0, 10**6), max_size=4), max_size=3)},
    optional=sampling,
)
backend = st.builds(
    BackendState,
    inflight=st.integers(0, 64),
    healthy=st.booleans(),
    running=st.none() | st.integers(0, 64),
    waiting=st.none() | st.integers(0, 64),
    kv_cache_usage=st.none() | st.floats(0, 1),
)


def check(body: dict[str, Any], endpoint: Endpoint, counter: TokenCounter) -> None:
    f = extract_features(body, endpoint, counter)
    assert f.prompt_tokens >= 0 and f.expected_output_tokens >= 0 and f.n >= 1
    assert f.workload in Workload


@SETTINGS
@given(body=chat_body)
def test_chat_extraction_never_raises(counter: TokenCounter, body: dict[str, Any]) -> None:
    check(body, Endpoint.CHAT, counter)


@SETTINGS
@given(body=completions_body)
def test_completions_extraction_never_raises(counter: TokenCounter, body: dict[str, Any]) -> None:
    check(body, Endpoint.COMPLETIONS, counter)


@SETTINGS
@given(body=chat_body, spec=backend, base=backend)
@example(  # max_tokens past a float's range: the prefill ratio overflowed (OverflowError)
    body={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**400},
    spec=BackendState(),
    base=BackendState(),
)
def test_decide_never_raises(
    counter: TokenCounter, body: dict[str, Any], spec: BackendState, base: BackendState
) -> None:
    d = RulesPolicy(RulesConfig()).decide(
        extract_features(body, Endpoint.CHAT, counter), LiveState.pair(spec, base)
    )
    assert d.route in PAIR and d.reason in REASONS


@SETTINGS
@given(
    body=chat_body,
    spec=backend,
    base=backend,
    beside=st.sampled_from([1.0, 2.0]),
    seed=st.none() | st.integers(0, 2**32),
)
def test_the_profiled_decision_never_raises_and_reads_only(
    counter: TokenCounter,
    body: dict[str, Any],
    spec: BackendState,
    base: BackendState,
    beside: float,
    seed: int | None,
) -> None:
    """On a profile (one GPU or a GPU each) with or without the gateway's rng: a known
    reason, finite predictions, and the same answer again (decide() writes nothing)."""
    profile = prior_profile(two_routes(4, 0.1))
    policy = ProfiledPolicy(RouterConfig(), routes=two_routes(4, 0.1))
    policy.use_profile(replace(profile.with_beside(beside), source="emulated"))
    f = extract_features(body, Endpoint.CHAT, counter)
    state = LiveState.pair(spec, base)
    rng = None if seed is None else random.Random(seed)
    d = policy.decide(f, state, rng)
    assert d.route in PAIR and d.reason in PROFILED_REASONS and d.why is not None
    assert d.predicted_s is not None and all(v >= 0 for v in d.predicted_s.values())
    again = policy.decide(f, state, None if seed is None else random.Random(seed))
    assert (again.route, again.reason) == (d.route, d.reason)


# Appending characters to one string is NOT monotone under BPE ("impor" is two
# cl100k tokens, "import" is one), so "more prompt" is tested as more messages,
# more text parts and more completion prompts: what a growing request adds.


def test_bpe_is_not_monotone_within_a_string(counter: TokenCounter) -> None:
    assert counter.count("impor") > counter.count("import")


@SETTINGS
@given(body=chat_body, extra=message)
def test_appending_a_message_never_lowers_prompt_tokens(
    counter: TokenCounter, body: dict[str, Any], extra: dict[str, Any]
) -> None:
    before = extract_features(body, Endpoint.CHAT, counter).prompt_tokens
    grown = {**body, "messages": [*body["messages"], extra]}
    assert extract_features(grown, Endpoint.CHAT, counter).prompt_tokens >= before


@SETTINGS
@given(texts=st.lists(text, min_size=2, max_size=4))
def test_appending_text_parts_never_lowers_prompt_tokens(
    counter: TokenCounter, texts: list[str]
) -> None:
    counts = []
    for i in range(1, len(texts) + 1):
        parts = [{"type": "text", "text": t} for t in texts[:i]]
        body = {"messages": [{"role": "user", "content": parts}]}
        counts.append(extract_features(body, Endpoint.CHAT, counter).prompt_tokens)
    assert counts == sorted(counts)


@SETTINGS
@given(prompts=st.lists(text, min_size=1, max_size=4), extra=text)
def test_appending_a_prompt_never_lowers_prompt_tokens(
    counter: TokenCounter, prompts: list[str], extra: str
) -> None:
    before = extract_features({"prompt": prompts}, Endpoint.COMPLETIONS, counter).prompt_tokens
    after = extract_features({"prompt": [*prompts, extra]}, Endpoint.COMPLETIONS, counter)
    assert after.prompt_tokens >= before
