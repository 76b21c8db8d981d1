"""`specroute train OUTCOMES.jsonl --out MODEL`: fit the offline acceptance model.

Reads the gateway's outcome log (rotated files may be passed too), keeps the
speculative requests with a measured acceptance, and writes the model as JSON
(schema, feature names, coefficients: nothing executable) for
`routing.model_path`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from classifier.acceptance_model import AcceptanceRecord, fit_acceptance_model
from gateway.commands import Help


def records_from_outcome_log(paths: list[Path]) -> Iterator[AcceptanceRecord]:
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                row = _row(line)
                if row is None:
                    continue
                try:
                    yield AcceptanceRecord.from_mapping(row)
                except ValueError as exc:
                    raise ValueError(f"{path}:{number}: {exc}") from None


def _row(line: str) -> dict[str, Any] | None:
    """The training row of one outcome line, or None if it taught nothing."""
    try:
        outcome = json.loads(line)
    except ValueError:
        return None
    features = outcome.get("features") if isinstance(outcome, dict) else None
    # What the router learns: accepted drafts per decode step / k (gateway/wire/acceptance.py);
    # a log written before it was recorded has vLLM's accepted / drafted only.
    acceptance = outcome.get("acceptance_per_step", outcome.get("acceptance"))
    if outcome.get("route") != "speculative" or not isinstance(features, dict):
        return None
    if acceptance is None or outcome.get("status") != "2xx":
        return None
    weight = outcome.get("completion_tokens") or 1  # long answers measure acceptance better
    return {**features, "acceptance": acceptance, "weight": weight}


HELP = Help(
    "fit the acceptance model from outcome logs (needs the `train` extra: scikit-learn)",
    "Fit the offline acceptance model from the gateway's outcome log (its speculative "
    "requests with a measured acceptance) and write it as JSON for routing.model_path.",
    ("specroute train /var/lib/specroute/outcomes.jsonl* --out model.json",),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("outcomes", type=Path, nargs="+", help="outcome log JSONL file(s)")
    p.add_argument("--out", type=Path, required=True, help="model file to write (JSON)")
    p.add_argument(
        "--num-speculative-tokens", type=int, default=4, help="k of the speculative server"
    )


def run(args: argparse.Namespace, argv: list[str]) -> int:
    return train(args.outcomes, args.out, args.num_speculative_tokens)


def train(paths: list[Path], out: Path, num_speculative_tokens: int) -> int:
    try:
        records = list(records_from_outcome_log(paths))
        model = fit_acceptance_model(records, num_speculative_tokens=num_speculative_tokens)
    except (OSError, ValueError) as exc:
        print(f"specroute train: {exc}", file=sys.stderr)
        return 2
    out.write_text(model.to_json())
    by_workload: dict[str, list[float]] = {}
    for r in records:
        by_workload.setdefault(r.workload.value, []).append(r.acceptance)
    print(f"trained on {model.trained_on} speculative requests, train MAE {model.train_mae:.3f}")
    for workload, values in sorted(by_workload.items()):
        mean = sum(values) / len(values)
        print(f"  {workload:<13} n={len(values):<6} mean measured acceptance {mean:.3f}")
    print(f"wrote {out} (set routing.model_path to use it)")
    return 0
