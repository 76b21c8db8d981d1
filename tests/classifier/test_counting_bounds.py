"""The tokenizer's work per request is bounded however the prompt is split.

A crafted 4 MB body of 1,000 distinct 4,000-character messages used to be
counted exactly, 0.23-0.30 s of CPU on the event loop per request: two such
senders held the gateway at 100%. The bound is counted in characters handed
to the tokenizer, so the test does not depend on this machine's speed.
"""

from __future__ import annotations

import random

import pytest

from classifier.features import Endpoint, extract_features
from classifier.tokens import TokenCounter

WORDS = ["alpha", "router", "token", "decode", "speculative", "network", "model", "gamma"]


class Tally:
    """A real counter that also adds up how many characters it was asked to count."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.chars = 0

    def count(self, text: str) -> int:
        self.chars += len(text)
        return self.counter.count(text)


def chat_of(parts: int, chars: int, seed: int = 0) -> dict[str, object]:
    rng = random.Random(seed)
    messages = []
    for _ in range(parts):
        text = " ".join(f"{rng.choice(WORDS)}{rng.randint(0, 999)}" for _ in range(chars // 6))
        messages.append({"role": "user", "content": text[:chars]})
    return {"model": "m", "messages": messages}


@pytest.mark.parametrize(("parts", "chars"), [(1000, 4000), (4000, 1000), (1, 4_000_000)])
def test_tokenizer_work_is_bounded_and_the_estimate_stays_close(
    counter: TokenCounter, parts: int, chars: int
) -> None:
    body = chat_of(parts, chars)
    tally = Tally(counter)
    estimate = extract_features(body, Endpoint.CHAT, tally).prompt_tokens
    # Texts are handed over whole until 8192 characters were counted; one huge
    # text is sampled on windows inside the counter (its own bound).
    assert tally.chars <= (chars if parts == 1 else 8192 + chars)
    exact = sum(counter.count(m["content"]) for m in body["messages"])  # type: ignore[attr-defined,index]
    assert estimate == pytest.approx(exact, rel=0.05)


def test_a_short_prompt_is_still_counted_exactly(counter: TokenCounter) -> None:
    body = chat_of(3, 1500)
    tally = Tally(counter)
    features = extract_features(body, Endpoint.CHAT, tally)
    assert tally.chars == 4500
    assert features.prompt_tokens == sum(counter.count(m["content"]) for m in body["messages"])  # type: ignore[attr-defined,index]
