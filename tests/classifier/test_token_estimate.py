"""Long prompts are counted on samples: within a few percent, at a bounded cost."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from classifier.tokens import TokenCounter

ROOT = Path(__file__).resolve().parents[2]


def _prose() -> str:
    """English prose that no edit of this project changes: Python's own help topics."""
    from pydoc_data.topics import topics

    return "\n".join(topics[name] for name in sorted(topics))


def _texts() -> list[str]:
    rng = random.Random(0)
    words = _prose().split()
    prose = [" ".join(rng.choice(words) for _ in range(n)) for n in (900, 2500, 6000)]
    code = (ROOT / "gateway" / "wire" / "proxy.py").read_text()
    return [*prose, code, code * 3]


@pytest.mark.parametrize(
    "text", _texts(), ids=["prose-1k", "prose-3k", "prose-7k", "code", "code-x3"]
)
def test_long_texts_are_estimated_within_ten_percent(
    counter: TokenCounter, pure_cl100k: object, text: str
) -> None:
    exact = len(pure_cl100k.encode_ordinary(text))  # type: ignore[attr-defined]
    assert len(text) > 4096
    assert counter.count(text) == pytest.approx(exact, rel=0.10)


def test_short_texts_stay_exact(counter: TokenCounter, pure_cl100k: object) -> None:
    text = _prose()[:4000]
    assert counter.count(text) == len(pure_cl100k.encode_ordinary(text))  # type: ignore[attr-defined]
