"""Per-request draft acceptance: what a real draft's success depends on.

A draft token is accepted when the target model would have produced it. That
happens often when the continuation is predictable and rarely when it is not:
- structured output (a JSON schema or json_object): braces, quotes, keys and
  commas are forced by the grammar, so drafts are accepted about 80% of the time;
- code and SQL: keywords and identifiers repeat, about 75%;
- ordinary chat: about 50%;
- creative writing, or any sampling at temperature >= 1: the target samples
  from a flat distribution the draft cannot guess, about 25%.
Temperature pulls every kind toward the creative level, quadratically (low
temperatures barely change the argmax). Structured output only goes half way,
since its syntax tokens stay forced at any temperature.

The result is the per-position acceptance probability `a` of the Leviathan
model: each of the k drafts is accepted with probability a, in order, stopping
at the first rejection. The classification here is deliberately independent of
classifier/ (the router): the emulator is the ground truth the router is
tested against and must not share its logic.
"""

from __future__ import annotations

import random
import re
from typing import Literal

from .config import EmulatorConfig

Kind = Literal["structured", "code", "chat", "creative"]

_CODE = re.compile(
    r"```|\bselect\b.+\bfrom\b|\bsql\b|\bquery\b|\bpython\b|\bjavascript\b|\btypescript\b"
    r"|\bfunction\b|\bdef \w+\(|\bclass \w+|\bcode\b|\bregex\b|\bbash\b|\bscript\b",
    re.IGNORECASE | re.DOTALL,
)
_CREATIVE = re.compile(
    r"\bstory\b|\bpoem\b|\bhaiku\b|\blyrics\b|\bfiction\b|\bimagine\b|\bcreative\b|\bsonnet\b",
    re.IGNORECASE,
)

# vLLM samples at temperature 1.0 when the request does not say.
DEFAULT_TEMPERATURE = 1.0


def classify(*, structured: bool, prompt_text: str) -> Kind:
    """The workload kind the emulated draft model sees in a request."""
    if structured:
        return "structured"
    if _CREATIVE.search(prompt_text):
        return "creative"
    if _CODE.search(prompt_text):
        return "code"
    return "chat"


def base_acceptance(c: EmulatorConfig, kind: Kind, temperature: float) -> float:
    """Acceptance probability of one draft position, before per-request jitter."""
    level = {
        "structured": c.acceptance_structured,
        "code": c.acceptance_code,
        "chat": c.acceptance_chat,
        "creative": c.acceptance_creative,
    }[kind]
    pull = min(max(temperature, 0.0), 1.0) ** 2
    if kind == "structured":
        pull *= 0.5
    return level + (c.acceptance_creative - level) * pull


def request_acceptance(
    c: EmulatorConfig, kind: Kind, temperature: float, rng: random.Random
) -> float:
    """Acceptance of one request: the base level plus a seeded jitter, in [0, 0.99]."""
    a = base_acceptance(c, kind, temperature)
    a += rng.uniform(-c.acceptance_jitter, c.acceptance_jitter)
    return min(max(a, 0.0), 0.99)


def draw_accepted(a: float, k: int, rng: random.Random) -> int:
    """How many of k drafts the target accepts: positions in order, stop at a rejection."""
    accepted = 0
    while accepted < k and rng.random() < a:
        accepted += 1
    return accepted
