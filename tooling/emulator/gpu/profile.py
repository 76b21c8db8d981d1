"""A measured GPU profile: step costs by batch, query tokens, context and prefill, interpolated.

A profile is a JSON file: the ones beside this module (built by build.py from
measured/), or any file `specroute gpu build` wrote from a user's own measurement
(docs/own-gpu.md). Each holds what one GPU measured for one target model: the
decode step per (batch, q) at a 1024-token context, the same at 4096 (the KV
reads), steps with a prefill chunk in them, a prompt's prefill alone, and each
drafter's pass. Between measured points a value is interpolated; outside them it
is extrapolated from the nearest segment:

- batch: linear in log(batch) between measured batches (steps grow slowly while
  the weights' read dominates, so a log axis keeps 1..256 on one scale); past the
  largest measured batch, linear in the batch itself (compute-bound there);
- query tokens q, prefill tokens, context: linear.

Nothing here is fitted: at every measured point the value is the measurement.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REFERENCE_CONTEXT = 1024  # KV tokens per sequence in the measured decode grid


def _segment(xs: Sequence[float], x: float) -> int:
    """Index i of the segment [xs[i], xs[i+1]] to use for x (the end ones outside)."""
    return min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)


def linear(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise linear through (xs, ys), extended past both ends by the end segments."""
    if len(xs) == 1:
        return ys[0]
    i = _segment(xs, x)
    w = (x - xs[i]) / (xs[i + 1] - xs[i])
    return ys[i] + w * (ys[i + 1] - ys[i])


def by_batch(batches: Sequence[int], ys: Sequence[float], b: float) -> float:
    """Linear in log(batch) inside the measured range; linear in batch past its top."""
    if len(batches) == 1:
        return ys[0]
    if b > batches[-1]:
        return linear(batches[-2:], ys[-2:], b)
    return linear([math.log(x) for x in batches], ys, math.log(max(b, 1e-9)))


@dataclass(frozen=True)
class Grid:
    """Milliseconds by batch (rows) and query tokens per sequence (columns)."""

    batches: tuple[int, ...]
    qs: tuple[int, ...]
    ms: tuple[tuple[float, ...], ...]

    @classmethod
    def from_json(cls, raw: dict[str, Any], where: str) -> Grid:
        _keys(raw, where, ("ctx", "batches", "qs", "ms"))
        grid = cls(tuple(raw["batches"]), tuple(raw["qs"]), tuple(tuple(row) for row in raw["ms"]))
        for axis, values in (("batches", grid.batches), ("qs", grid.qs)):
            if not values or list(values) != sorted(set(values)) or min(values) < 1:
                raise ValueError(f"{where}.{axis}: want ascending numbers >= 1, got {values}")
        if len(grid.ms) != len(grid.batches) or any(len(r) != len(grid.qs) for r in grid.ms):
            raise ValueError(f"{where}.ms: want one row per batch, one value per q")
        return grid

    def at(self, b: float, q: float) -> float:
        """Interpolated in q at every measured batch, then across batches; never below the
        q=min column (a step with more query tokens costs no less)."""
        per_batch = [max(linear(self.qs, row, q), row[0]) for row in self.ms]
        return by_batch(self.batches, per_batch, b)


@dataclass(frozen=True)
class Drafter:
    """One drafter of the target: its pass per (batch, q), and its compute per token
    relative to the target's (its prefill work is priced with that ratio)."""

    name: str
    what: str
    method: str  # vLLM's --speculative-config method: draft_model, eagle3, ngram, ...
    passes: Grid | None  # None: no model pass (n-gram lookup)
    context: Grid | None
    compute_ratio: float

    def pass_ms(self, b: float, q: float, ctx: float) -> float:
        if self.passes is None or b <= 0:
            return 0.0
        ms = self.passes.at(b, q)
        if self.context is not None:
            ms += _context_extra(self.passes, self.context, b, q, ctx)
        return ms


def _context_extra(short: Grid, long: Grid, b: float, q: float, ctx: float) -> float:
    """What `ctx` KV tokens per sequence add over the grid's 1024, linear in the context;
    past the largest batch measured at 4096 the extra grows with the batch (KV bytes do)."""
    top = long.batches[-1]
    qq = min(max(q, long.qs[0]), long.qs[-1])
    deltas = [
        linear(long.qs, lrow, qq) - linear(short.qs, short.ms[short.batches.index(lb)], qq)
        for lb, lrow in zip(long.batches, long.ms, strict=True)
    ]
    delta = by_batch(long.batches, deltas, min(b, top)) * max(b / top, 1.0)
    span = 4096 - REFERENCE_CONTEXT
    return delta * (max(ctx, 0.0) - REFERENCE_CONTEXT) / span


@dataclass(frozen=True)
class MixedSteps:
    """Decode steps with a prefill chunk in them: what the chunk adds, by batch, q, tokens."""

    batches: tuple[int, ...]
    qs: tuple[int, ...]
    tokens: tuple[int, ...]  # 0 first: a step without a chunk adds nothing
    extras: tuple[tuple[tuple[float, ...], ...], ...]  # ms, [batch][q][tokens]

    @classmethod
    def from_json(cls, raw: dict[str, Any], steps: dict[str, Any]) -> MixedSteps:
        _keys(raw, "mixed", ("ctx", "batches", "qs", "prefill_tokens", "ms"))
        plain = Grid.from_json(steps, "steps")
        extra = tuple(
            tuple(
                (0.0, *(ms - plain.at(b, q) for ms in raw["ms"][bi][qi]))
                for qi, q in enumerate(raw["qs"])
            )
            for bi, b in enumerate(raw["batches"])
        )
        return cls(tuple(raw["batches"]), tuple(raw["qs"]), (0, *raw["prefill_tokens"]), extra)

    def extra_ms(self, b: float, q: float, tokens: float) -> float:
        qq = min(max(q, self.qs[0]), self.qs[-1])
        bb = min(max(b, self.batches[0]), self.batches[-1])
        per_batch = [
            linear(self.qs, [linear(self.tokens, row, tokens) for row in by_q], qq)
            for by_q in self.extras
        ]
        return max(by_batch(self.batches, per_batch, bb), 0.0)


@dataclass(frozen=True)
class GpuProfile:
    """One GPU and target model as measured: the step costs the emulator runs on."""

    name: str
    target: str
    card: str
    measured: str
    method: str
    steps: Grid
    context: Grid | None
    mixed: MixedSteps | None
    prefill_tokens: tuple[int, ...]
    prefill_ms: tuple[float, ...]
    drafters: dict[str, Drafter]
    pair: tuple[dict[str, float], ...]

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> GpuProfile:
        """The profile a file holds; ValueError naming the first key that is wrong."""
        _keys(raw, "profile", _PROFILE_KEYS, optional=("files", "built_by"))
        _keys(raw["prefill"], "prefill", ("tokens", "ms"))
        drafters = {}
        for name, d in raw["drafters"].items():
            where = f"drafters.{name}"
            _keys(d, where, ("what", "method", "passes", "context", "compute_ratio"))
            drafters[name] = Drafter(
                name,
                d["what"],
                d["method"],
                Grid.from_json(d["passes"], f"{where}.passes") if d["passes"] else None,
                Grid.from_json(d["context"], f"{where}.context") if d["context"] else None,
                float(d["compute_ratio"]),
            )
        return cls(
            name=raw["name"],
            target=raw["target"],
            card=raw["card"],
            measured=raw["measured"],
            method=raw["method"],
            steps=Grid.from_json(raw["steps"], "steps"),
            context=Grid.from_json(raw["context"], "context") if raw["context"] else None,
            mixed=MixedSteps.from_json(raw["mixed"], raw["steps"]) if raw["mixed"] else None,
            prefill_tokens=tuple(raw["prefill"]["tokens"]),
            prefill_ms=tuple(raw["prefill"]["ms"]),
            drafters=drafters,
            pair=tuple(raw["pair"]),
        )

    def describe(self) -> str:
        """One line for everything the emulator prints."""
        card, target = self.card.split(" (")[0], self.target.split(",")[0]
        return f"measured GPU {self.name} ({card}, {target}, {self.measured}; not vLLM)"

    def decode_ms(self, b: float, q: float, ctx: float = REFERENCE_CONTEXT) -> float:
        """The target's step: b sequences with q query tokens each, ctx KV tokens each."""
        ms = self.steps.at(b, q)
        if self.context is not None:
            ms += _context_extra(self.steps, self.context, b, q, ctx)
        return ms

    def prefill_alone_ms(self, tokens: float) -> float:
        """A step that only prefills `tokens` prompt tokens (measured eager, batch 1)."""
        return max(linear(self.prefill_tokens, self.prefill_ms, tokens), 0.0)

    def chunk_extra_ms(self, b: float, q: float, tokens: float) -> float:
        """What a prefill chunk of `tokens` adds to a decode step of b sequences.

        Measured at batch 8-64 and q 1 and 5 (held outside those), 512 and 2048 tokens
        (linear through zero, extended past 2048). A profile without mixed steps prices
        the chunk as the prefill table's growth from zero tokens."""
        if tokens <= 0:
            return 0.0
        if self.mixed is None:
            return max(self.prefill_alone_ms(tokens) - self.prefill_alone_ms(0), 0.0)
        return self.mixed.extra_ms(b, q, tokens)

    @property
    def default_drafter(self) -> str:
        """The drafter a speculative server gets unless told: the first measured ("" none)."""
        return next(iter(self.drafters), "")

    def drafter(self, name: str) -> Drafter:
        try:
            return self.drafters[name]
        except KeyError:
            have = ", ".join(sorted(self.drafters)) or "none: this profile is target only"
            raise ValueError(
                f"GPU profile {self.name} has no drafter {name!r} (measured: {have})"
            ) from None


_PROFILE_KEYS = (
    "name",
    "target",
    "card",
    "measured",
    "method",
    "steps",
    "context",
    "mixed",
    "prefill",
    "drafters",
    "pair",
)


def _keys(
    raw: Mapping[str, Any], where: str, required: Sequence[str], optional: Sequence[str] = ()
) -> None:
    """Every required key there, and no other: a misspelt key is an error, not a default."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: want a JSON object, got {type(raw).__name__}")
    missing = [k for k in required if k not in raw]
    unknown = sorted(set(raw) - {*required, *optional})
    if missing or unknown:
        raise ValueError(f"{where}: missing keys {missing}, unknown keys {unknown}")


def profile_names() -> tuple[str, ...]:
    """The shipped profiles, by name (the .json files beside this module)."""
    return tuple(sorted(p.stem for p in HERE.glob("*.json")))


def is_profile_path(ref: str) -> bool:
    """A --gpu-profile that names a file rather than a shipped profile."""
    return ref.endswith(".json") or "/" in ref


@cache
def load_gpu_profile(ref: str) -> GpuProfile:
    """A shipped profile by name, or a profile file by path; a clear error otherwise."""
    if not is_profile_path(ref):
        if ref not in profile_names():
            raise ValueError(
                f"no GPU profile {ref!r}; shipped: {', '.join(profile_names())}, a profile "
                "file PATH.json (`specroute gpu build`), or 'roofline'"
            )
        return GpuProfile.from_json(json.loads((HERE / f"{ref}.json").read_text("utf-8")))
    path = Path(ref)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"GPU profile file {ref}: cannot read it ({exc.strerror})") from None
    try:
        return GpuProfile.from_json(json.loads(text))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(
            f"GPU profile file {ref} is not a profile (`specroute gpu build` writes one): {exc}"
        ) from None
