"""Build the emulator's GPU profiles from the measured step costs in measured/*.jsonl.

    python -m tooling.emulator.gpu.build          # rewrites the .json files beside this one

measured/ holds the raw JSON lines of `measure_steps.py` on an NVIDIA H200 (its
README says how, and what it is not: random weights, CUDA-graph steps, not vLLM).
This script only regroups them into tables, one file per GPU and target model,
with the provenance written into each file; it fits nothing. A test rebuilds the
files and compares them with the committed ones, so the data and the tables cannot
drift apart.

Where a quantity was measured in several runs (the pair of processes in run 2 and
run 3), the median of the runs is kept, as measured/tables.py does.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MEASURED = HERE / "measured"

_PROVENANCE = {
    "card": "NVIDIA H200 (141 GB HBM3e), driver 580.159, PyTorch 2.11 + CUDA 13.0",
    "measured": "2026-12-04",
    "method": (
        "measure_steps.py: the model's shapes in bf16 with random weights, each decode step "
        "replayed from a CUDA graph (median of 15); prefill eager (median of 5). Not vLLM: no "
        "paged KV, no rotary, greedy argmax instead of vLLM's sampler and rejection sampler, "
        "no scheduler or detokenizer CPU time (vLLM adds about 1-2 ms per step, partly hidden "
        "by async scheduling)"
    ),
    "files": "tooling/emulator/gpu/measured/run1.jsonl, run2-pair.jsonl, run3-extra-pair.jsonl",
    "built_by": "python -m tooling.emulator.gpu.build",
}

# The drafters of an 8B target, as measure_steps.py built them.
_DRAFTERS = {
    "draft-1b": ("llama-3.2-1b", "a separate draft model, the Llama-3.2-1B shape (2.5 GB)"),
    "eagle3": (
        "eagle3-head-8b",
        "an EAGLE-3-like head: one target-width layer, a 3*hidden->hidden fc, a 32k-vocab head",
    ),
}


def _rows() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(MEASURED.glob("*.jsonl")):
        with path.open(encoding="utf-8") as fh:
            out += [json.loads(line) for line in fh if line.strip()]
    return out


def _decode(rows: list[dict[str, Any]], model: str) -> dict[tuple[int, int, int, int], float]:
    return {
        (r["batch"], r["q"], r["ctx"], r["prefill"]): r["ms"]
        for r in rows
        if r["kind"] == "decode" and r["model"] == model
    }


def _grid(dec: dict[tuple[int, int, int, int], float], ctx: int) -> dict[str, Any]:
    """Step ms by batch and query tokens at one context, plain decode (no prefill chunk)."""
    cells = {(b, q): ms for (b, q, c, p), ms in dec.items() if c == ctx and p == 0}
    batches = sorted({b for b, _ in cells})
    qs = sorted({q for _, q in cells})
    missing = [(b, q) for b in batches for q in qs if (b, q) not in cells]
    if missing:
        raise ValueError(f"incomplete grid at ctx {ctx}: missing (batch, q) {missing}")
    return {
        "ctx": ctx,
        "batches": batches,
        "qs": qs,
        "ms": [[cells[(b, q)] for q in qs] for b in batches],
    }


def _mixed(dec: dict[tuple[int, int, int, int], float]) -> dict[str, Any] | None:
    cells = {(b, q, p): ms for (b, q, c, p), ms in dec.items() if c == 1024 and p > 0}
    if not cells:
        return None
    batches = sorted({b for b, _, _ in cells})
    qs = sorted({q for _, q, _ in cells})
    prefills = sorted({p for _, _, p in cells})
    return {
        "ctx": 1024,
        "batches": batches,
        "qs": qs,
        "prefill_tokens": prefills,
        "ms": [[[cells[(b, q, p)] for p in prefills] for q in qs] for b in batches],
    }


def _prefill(rows: list[dict[str, Any]], model: str) -> dict[str, Any]:
    cells = {r["tokens"]: r["ms"] for r in rows if r["kind"] == "prefill" and r["model"] == model}
    tokens = sorted(cells)
    return {"tokens": tokens, "ms": [cells[n] for n in tokens]}


def _pair(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two processes on one GPU: each one's step alone and beside the other, busy."""
    by: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        if r["kind"] == "pair":
            by.setdefault((r["phase"], r["role"], str(r["batch"])), []).append(r["ms"])

    def ms(key: tuple[str, str, str]) -> float:
        return round(statistics.median(by[key]), 4)

    out = []
    for base, spec in ((1, 1), (8, 8), (32, 32), (64, 64), (1, 64), (64, 1)):
        both = ("both", str(base)) if base == spec else ("cross", f"{base}x{spec}")
        out.append(
            {
                "base_batch": base,
                "spec_batch": spec,
                "base_alone_ms": ms(("alone-base", "base", str(base))),
                "base_beside_ms": ms((both[0], "base", both[1])),
                "spec_alone_ms": ms(("alone-spec", "spec", str(spec))),
                "spec_beside_ms": ms((both[0], "spec", both[1])),
            }
        )
    return out


def _compute_ratio(
    drafter: dict[tuple[int, int, int, int], float], target: dict[tuple[int, int, int, int], float]
) -> float:
    """The drafter's compute per token over the target's, where both are compute-bound:
    (q=5 minus q=1) at the largest measured batch. Prices the drafter's prefill work."""
    b = max(b for b, _, c, p in drafter if c == 1024 and p == 0)
    d = drafter[(b, 5, 1024, 0)] - drafter[(b, 1, 1024, 0)]
    t = target[(b, 5, 1024, 0)] - target[(b, 1, 1024, 0)]
    return round(d / t, 4)


def build() -> dict[str, dict[str, Any]]:
    """Every profile the measured rows support, by name."""
    rows = _rows()
    target = _decode(rows, "llama-3.1-8b")
    drafters: dict[str, Any] = {}
    for name, (model, what) in _DRAFTERS.items():
        dec = _decode(rows, model)
        has_long = any(c == 4096 for _, _, c, _ in dec)
        drafters[name] = {
            "what": what,
            "passes": _grid(dec, 1024),
            "context": _grid(dec, 4096) if has_long else None,
            "compute_ratio": _compute_ratio(dec, target),
        }
    drafters["ngram"] = {
        "what": "n-gram prompt lookup: no model pass (its CPU lookup is not measured)",
        "passes": None,
        "context": None,
        "compute_ratio": 0.0,
    }
    llama: dict[str, Any] = {
        "name": "h200-llama3.1-8b",
        "target": "Llama-3.1-8B shape, bf16 (16.06 GB)",
        **_PROVENANCE,
        "steps": _grid(target, 1024),
        "context": _grid(target, 4096),
        "mixed": _mixed(target),
        "prefill": _prefill(rows, "llama-3.1-8b"),
        "drafters": drafters,
        "pair": _pair(rows),
    }
    qwen = _decode(rows, "qwen3-32b")
    big: dict[str, Any] = {
        "name": "h200-qwen3-32b",
        "target": "Qwen3-32B shape, bf16 (65.5 GB); target only: no drafter, no context or "
        "mixed-step rows were measured",
        **_PROVENANCE,
        "steps": _grid(qwen, 1024),
        "context": None,
        "mixed": None,
        "prefill": _prefill(rows, "qwen3-32b"),
        "drafters": {},
        "pair": [],
    }
    return {p["name"]: p for p in (llama, big)}


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
