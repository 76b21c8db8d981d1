"""Prompts the real-engine tests send to the CPU pair (SmolLM2-135M, n-gram
speculation, k = 4): one kind where n-gram drafts pay and one where they miss.

The tiny model does not follow edit instructions, so "code" asks it to repeat a
function verbatim: n-gram drafts copy the context, which is where speculation
pays. "creative" is a surreal poem at temperature 1.2, whose drafts the model
almost never follows.
"""

from __future__ import annotations

from typing import Any

FUNCTIONS = (
    '''def mean(values):
    """Return the arithmetic mean of a non-empty list of numbers."""
    total = 0.0
    for value in values:
        total += value
    return total / len(values)
''',
    '''def is_palindrome(text):
    """True if text reads the same forwards and backwards, ignoring case."""
    cleaned = text.lower()
    return cleaned == cleaned[::-1]
''',
    '''def clamp(value, low, high):
    """Limit value to the closed range [low, high]."""
    if value < low:
        return low
    if value > high:
        return high
    return value
''',
)
TOPICS = (
    "a lighthouse that dreams",
    "a cat who owns a bakery",
    "the last train to the moon",
    "a clock that runs backwards",
)


def repeat_code(i: int, model: str) -> dict[str, Any]:
    fn = FUNCTIONS[i % len(FUNCTIONS)]
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"Repeat this Python function exactly:\n\n{fn}"}],
        "temperature": 0,
        "max_tokens": 64,
    }


def creative(i: int, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {"role": "user", "content": f"Write a short surreal poem about {TOPICS[i % 4]}."}
        ],
        "temperature": 1.2,
        "seed": 100 + i,  # sampled, yet the same poems every run: the test does not draw
        "max_tokens": 48,
    }
