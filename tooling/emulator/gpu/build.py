"""Build a GPU profile from the JSON lines of a step measurement (measured/measure_steps.py).

    python -m tooling.emulator.gpu.build          # rewrites the shipped .json files beside this one
    specroute gpu build RUN.jsonl... -o my.json    # any run of `specroute gpu measure`

The builder only regroups the measured rows into tables, with the provenance written
into the file; it fits nothing. What it builds is described by a `ProfileSpec`: which
model of the run is the target, which are its drafters (name, vLLM method), and where
and when it was measured. A run of `specroute gpu measure` says all of that in its
`setup` line (`spec_from_run`); the H200 runs in measured/ predate that line, so their
spec is written here (`SHIPPED`). Both go through `build_profile`, and a test rebuilds
the shipped files and compares them with the committed ones, so the data and the tables
cannot drift apart.

Where a quantity was measured in several runs (the pair of processes in run 2 and run 3),
the median of the runs is kept, as measured/tables.py does. A batch whose row of a grid
is incomplete (out of memory on a smaller GPU, say) is left out of that grid, and said.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .profile import REFERENCE_CONTEXT

HERE = Path(__file__).resolve().parent
MEASURED = HERE / "measured"
LONG_CONTEXT = 4096  # the second context measure_steps.py times (profile.py's span)

METHOD = (
    "measure_steps.py: the model's shapes in bf16 with random weights, each decode step "
    "replayed from a CUDA graph (median of 15); prefill eager (median of 5). Not vLLM: no "
    "paged KV, no rotary, greedy argmax instead of vLLM's sampler and rejection sampler, "
    "no scheduler or detokenizer CPU time (vLLM adds about 1-2 ms per step, partly hidden "
    "by async scheduling)"
)
NGRAM_WHAT = "n-gram prompt lookup: no model pass (its CPU lookup is not measured)"

Row = dict[str, Any]
Cells = dict[tuple[int, int, int, int], float]


@dataclass(frozen=True, slots=True)
class DrafterSpec:
    """One drafter of the profile: its name there, the run's model rows (None: no model
    pass, n-gram), vLLM's speculative method, and what it is."""

    name: str
    model: str | None
    method: str
    what: str


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """What one profile is built from: the target's rows, its drafters, the provenance."""

    name: str
    target_model: str  # the run's `model` of the target rows
    target: str  # what the target is, for people
    card: str
    measured: str
    files: str
    built_by: str
    drafters: tuple[DrafterSpec, ...] = ()
    pair: bool = True  # the run's two-process rows belong to this target


_H200 = {  # the provenance of the runs in measured/ (their README)
    "card": "NVIDIA H200 (141 GB HBM3e), driver 580.159, PyTorch 2.11 + CUDA 13.0",
    "measured": "2026-12-04",
    "files": "tooling/emulator/gpu/measured/run1.jsonl, run2-pair.jsonl, run3-extra-pair.jsonl",
    "built_by": "python -m tooling.emulator.gpu.build",
}

# The runs in measured/ (before measure_steps.py wrote a setup line): what measured what.
SHIPPED = (
    ProfileSpec(
        name="h200-llama3.1-8b",
        target_model="llama-3.1-8b",
        target="Llama-3.1-8B shape, bf16 (16.06 GB)",
        drafters=(
            DrafterSpec(
                "draft-1b",
                "llama-3.2-1b",
                "draft_model",
                "a separate draft model, the Llama-3.2-1B shape (2.5 GB)",
            ),
            DrafterSpec(
                "eagle3",
                "eagle3-head-8b",
                "eagle3",
                "an EAGLE-3-like head: one target-width layer, a 3*hidden->hidden fc, "
                "a 32k-vocab head",
            ),
            DrafterSpec("ngram", None, "ngram", NGRAM_WHAT),
        ),
        card=_H200["card"],
        measured=_H200["measured"],
        files=_H200["files"],
        built_by=_H200["built_by"],
    ),
    ProfileSpec(
        name="h200-qwen3-32b",
        target_model="qwen3-32b",
        target="Qwen3-32B shape, bf16 (65.5 GB); target only: no drafter, no context or "
        "mixed-step rows were measured",
        pair=False,
        card=_H200["card"],
        measured=_H200["measured"],
        files=_H200["files"],
        built_by=_H200["built_by"],
    ),
)


def read_rows(paths: Iterable[Path]) -> list[Row]:
    """Every JSON line of the runs, in order; a line that is not JSON names its file."""
    out: list[Row] = []
    for path in paths:
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not a JSON line ({exc.msg})") from None
    return out


def _decode(rows: list[Row], model: str) -> Cells:
    return {
        (r["batch"], r["q"], r["ctx"], r["prefill"]): r["ms"]
        for r in rows
        if r["kind"] == "decode" and r["model"] == model
    }


def _grid(dec: Cells, ctx: int, notes: list[str], what: str) -> dict[str, Any] | None:
    """Step ms by batch and query tokens at one context, plain decode (no prefill chunk);
    a batch missing any q is left out (and noted). None: nothing measured at ctx."""
    cells = {(b, q): ms for (b, q, c, p), ms in dec.items() if c == ctx and p == 0}
    qs = sorted({q for _, q in cells})
    batches = []
    for b in sorted({b for b, _ in cells}):
        missing = [q for q in qs if (b, q) not in cells]
        if missing:
            notes.append(f"{what} at ctx {ctx}: batch {b} left out (no q {missing})")
        else:
            batches.append(b)
    if not batches:
        return None
    return {
        "ctx": ctx,
        "batches": batches,
        "qs": qs,
        "ms": [[cells[(b, q)] for q in qs] for b in batches],
    }


def _mixed(dec: Cells, notes: list[str]) -> dict[str, Any] | None:
    cells = {(b, q, p): ms for (b, q, c, p), ms in dec.items() if c == REFERENCE_CONTEXT and p}
    qs = sorted({q for _, q, _ in cells})
    prefills = sorted({p for _, _, p in cells})
    batches = []
    for b in sorted({b for b, _, _ in cells}):
        if all((b, q, p) in cells for q in qs for p in prefills):
            batches.append(b)
        else:
            notes.append(f"mixed steps: batch {b} left out (incomplete)")
    if not batches:
        return None
    return {
        "ctx": REFERENCE_CONTEXT,
        "batches": batches,
        "qs": qs,
        "prefill_tokens": prefills,
        "ms": [[[cells[(b, q, p)] for p in prefills] for q in qs] for b in batches],
    }


def _prefill(rows: list[Row], model: str) -> dict[str, Any]:
    cells = {r["tokens"]: r["ms"] for r in rows if r["kind"] == "prefill" and r["model"] == model}
    tokens = sorted(cells)
    return {"tokens": tokens, "ms": [cells[n] for n in tokens]}


def _pair(rows: list[Row]) -> list[dict[str, Any]]:
    """Two processes on one GPU: each one's step alone and beside the other, busy; every
    same-batch phase, then the cross ones (base batch x spec batch) in the run's order."""
    by: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        if r["kind"] == "pair":
            by.setdefault((r["phase"], r["role"], str(r["batch"])), []).append(r["ms"])

    def ms(key: tuple[str, str, str]) -> float:
        return round(statistics.median(by[key]), 4)

    same = sorted({int(b) for phase, _, b in by if phase == "both"})
    combos = [(b, b, ("both", str(b))) for b in same]
    for phase, role, b in by:
        if phase == "cross" and role == "base":
            base, spec = (int(x) for x in b.split("x"))
            combos.append((base, spec, ("cross", b)))
    out = []
    for base, spec, (phase, key) in combos:
        need = [
            ("alone-base", "base", str(base)),
            (phase, "base", key),
            ("alone-spec", "spec", str(spec)),
            (phase, "spec", key),
        ]
        if not all(k in by for k in need):
            continue
        out.append(
            {
                "base_batch": base,
                "spec_batch": spec,
                "base_alone_ms": ms(need[0]),
                "base_beside_ms": ms(need[1]),
                "spec_alone_ms": ms(need[2]),
                "spec_beside_ms": ms(need[3]),
            }
        )
    return out


def _compute_ratio(drafter: Cells, target: Cells) -> float:
    """The drafter's compute per token over the target's, where both are compute-bound:
    (q=Q minus q=1) at the largest batch both measured, Q the smallest q > 1 both have.
    Prices the drafter's prefill work."""

    def plain(cells: Cells) -> set[tuple[int, int]]:
        return {(b, q) for b, q, c, p in cells if c == REFERENCE_CONTEXT and p == 0}

    both = plain(drafter) & plain(target)
    qs = sorted({q for _, q in both if q > 1})
    if not qs:
        raise ValueError("no q > 1 measured for both the drafter and the target")
    b = max(b for b, q in both if q == qs[0] and (b, 1) in both)
    d = drafter[(b, qs[0], REFERENCE_CONTEXT, 0)] - drafter[(b, 1, REFERENCE_CONTEXT, 0)]
    t = target[(b, qs[0], REFERENCE_CONTEXT, 0)] - target[(b, 1, REFERENCE_CONTEXT, 0)]
    return round(d / t, 4)


def build_profile(
    rows: list[Row], spec: ProfileSpec, notes: list[str] | None = None
) -> dict[str, Any]:
    """The profile `spec` describes, from the run's rows (notes: what was left out)."""
    notes = [] if notes is None else notes
    target = _decode(rows, spec.target_model)
    steps = _grid(target, REFERENCE_CONTEXT, notes, spec.target_model)
    if steps is None:
        raise ValueError(
            f"no decode steps of {spec.target_model!r} at ctx {REFERENCE_CONTEXT} in the run"
        )
    drafters: dict[str, Any] = {}
    for d in spec.drafters:
        if d.model is None:
            drafters[d.name] = {
                "what": d.what,
                "method": d.method,
                "passes": None,
                "context": None,
                "compute_ratio": 0.0,
            }
            continue
        dec = _decode(rows, d.model)
        passes = _grid(dec, REFERENCE_CONTEXT, notes, d.model)
        if passes is None:
            raise ValueError(f"drafter {d.name}: no decode steps of {d.model!r} in the run")
        drafters[d.name] = {
            "what": d.what,
            "method": d.method,
            "passes": passes,
            "context": _grid(dec, LONG_CONTEXT, notes, d.model),
            "compute_ratio": _compute_ratio(dec, target),
        }
    return {
        "name": spec.name,
        "target": spec.target,
        "card": spec.card,
        "measured": spec.measured,
        "method": METHOD,
        "files": spec.files,
        "built_by": spec.built_by,
        "steps": steps,
        "context": _grid(target, LONG_CONTEXT, notes, spec.target_model),
        "mixed": _mixed(target, notes),
        "prefill": _prefill(rows, spec.target_model),
        "drafters": drafters,
        "pair": _pair(rows) if spec.pair else [],
    }


def spec_from_run(rows: list[Row], name: str | None, files: str, built_by: str) -> ProfileSpec:
    """The spec a run of `specroute gpu measure` wrote in its start and setup lines."""
    start = next((r for r in rows if r.get("kind") == "start"), None)
    setup = next((r for r in rows if r.get("kind") == "setup"), None)
    if start is None or setup is None:
        raise ValueError(
            "the run has no start or setup line: not written by `specroute gpu measure` "
            "(measure_steps.py with SHAPES set)"
        )
    if start.get("small") or not start.get("cuda"):
        raise ValueError(
            "the run is SMALL=1 or had no CUDA (tiny shapes at a 32-token context): it checks "
            "measure_steps.py, it makes no profile"
        )
    target = setup["target"]
    card = f"{start['device']}, PyTorch {start['torch']}"
    return ProfileSpec(
        name=name or setup["name"],
        target_model=target["name"],
        target=f"{target['name']} shape ({target['source']}), bf16",
        card=card,
        measured=setup["date"],
        files=files,
        built_by=built_by,
        drafters=tuple(
            DrafterSpec(d["drafter"], d.get("name"), d["method"], d["what"])
            for d in setup["drafters"]
        ),
        pair=bool(setup.get("pair")),
    )


def build() -> dict[str, dict[str, Any]]:
    """The shipped profiles, by name, from measured/."""
    rows = read_rows(sorted(MEASURED.glob("*.jsonl")))
    return {spec.name: build_profile(rows, spec) for spec in SHIPPED}


def render(profile: dict[str, Any]) -> str:
    """The file's text, as committed (the test compares it byte for byte)."""
    return json.dumps(profile, indent=1) + "\n"


def main() -> int:
    for name, profile in build().items():
        path = HERE / f"{name}.json"
        path.write_text(render(profile), encoding="utf-8")
        print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
