"""Offline acceptance model: trained with scikit-learn, stored as JSON, applied as a dot product.

`specroute train` fits it on the outcome log; the gateway loads the file at
start. The file holds the schema version, the feature names and the
coefficients, nothing executable: a pickle would run code on load and break
with every scikit-learn upgrade, while this is read by json and checked field
by field, and a file made for another feature set is refused with a message
that says what differs (ModelFileError), never silently misapplied.

The target is the per-position acceptance a (see speculation.py), recovered
from each record's accepted drafts per decode step over k (the outcome log's
acceptance_per_step), so a model trained with one number of speculative
tokens still applies when k changes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from classifier.features import RequestFeatures, Workload
from classifier.speculation import alpha_from_rate

__all__ = [
    "FEATURE_NAMES",
    "SCHEMA",
    "AcceptanceModel",
    "AcceptanceRecord",
    "ModelFileError",
    "acceptance_features",
    "fit_acceptance_model",
    "load_acceptance_model",
]

SCHEMA = "specroute.acceptance-model/1"
_WORKLOADS = tuple(Workload)
_WORKLOAD_NAMES = frozenset(w.value for w in Workload)
FEATURE_NAMES: tuple[str, ...] = (
    "code_like",
    "temperature",
    "temperature_squared",
    "greedy",
    "log_prompt_tokens",
    *(f"workload_{w.value}" for w in _WORKLOADS),
)
MIN_RECORDS = 10


class ModelFileError(ValueError):
    """The acceptance model file is unreadable, or made for another feature set."""


def acceptance_features(
    workload: Workload, code_like: bool, temperature: float, prompt_tokens: int
) -> tuple[float, ...]:
    """The fixed feature vector, in FEATURE_NAMES order. Cheap: no text, a log at most."""
    t = min(max(temperature, 0.0), 2.0)
    return (
        1.0 if code_like else 0.0,
        t,
        t * t,
        1.0 if t <= 0.0 else 0.0,
        math.log1p(max(prompt_tokens, 0)) / 10.0,
        *(1.0 if workload is w else 0.0 for w in _WORKLOADS),
    )


@dataclass(frozen=True, slots=True)
class AcceptanceRecord:
    """One finished speculative request, as the trainer needs it."""

    workload: Workload
    code_like: bool
    temperature: float
    prompt_tokens: int
    acceptance: float  # accepted drafts per decode step / k (vLLM's accepted/drafted in old logs)
    weight: float = 1.0  # e.g. proposed draft tokens: long answers measure acceptance better

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> AcceptanceRecord:
        """From one outcome-log object with these field names; ValueError says which is wrong."""
        try:
            workload = row["workload"]
            code_like, temperature = row["code_like"], row["temperature"]
            prompt_tokens, acceptance = row["prompt_tokens"], row["acceptance"]
            weight = row.get("weight", 1.0)
        except KeyError as exc:
            raise ValueError(f"acceptance record lacks {exc.args[0]!r}") from None
        if workload not in _WORKLOAD_NAMES:
            raise ValueError(
                f"acceptance record: workload must be one of {sorted(_WORKLOAD_NAMES)}"
            )
        if not isinstance(code_like, bool):
            raise ValueError("acceptance record: code_like must be true or false")
        if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int):
            raise ValueError("acceptance record: prompt_tokens must be an integer")
        for name, value in (("temperature", temperature), ("acceptance", acceptance)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"acceptance record: {name} must be a number")
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ValueError("acceptance record: weight must be a number")
        return cls(
            Workload(workload),
            code_like,
            float(temperature),
            prompt_tokens,
            float(acceptance),
            float(weight),
        )


@dataclass(frozen=True, slots=True)
class AcceptanceModel:
    """Linear in acceptance_features: intercept + coefficients . x, clamped to [0, 1]."""

    coefficients: tuple[float, ...]
    intercept: float
    trained_on: int = 0
    train_mae: float = 0.0
    num_speculative_tokens: int = 0  # k of the server the records came from (informative)

    def predict(self, f: RequestFeatures) -> float:
        x = acceptance_features(f.workload, f.code_like, f.temperature, f.prompt_tokens)
        value = self.intercept + sum(w * v for w, v in zip(self.coefficients, x, strict=True))
        return min(1.0, max(0.0, value))

    def to_json(self) -> str:
        return json.dumps(
            {
                "schema": SCHEMA,
                "target": "per-position draft acceptance probability",
                "features": list(FEATURE_NAMES),
                "coefficients": list(self.coefficients),
                "intercept": self.intercept,
                "trained_on": self.trained_on,
                "train_mae": self.train_mae,
                "num_speculative_tokens": self.num_speculative_tokens,
            },
            indent=2,
        )


def fit_acceptance_model(
    records: Iterable[AcceptanceRecord], *, num_speculative_tokens: int, l2: float = 1.0
) -> AcceptanceModel:
    """Ridge regression of a on acceptance_features; ValueError if there is too little data."""
    import numpy as np
    from sklearn.linear_model import Ridge

    rows = [
        r
        for r in records
        if math.isfinite(r.acceptance) and math.isfinite(r.weight) and r.weight > 0
    ]
    if len(rows) < MIN_RECORDS:
        raise ValueError(f"need at least {MIN_RECORDS} records with an acceptance, got {len(rows)}")
    x = np.array(
        [acceptance_features(r.workload, r.code_like, r.temperature, r.prompt_tokens) for r in rows]
    )
    y = np.array([alpha_from_rate(r.acceptance, num_speculative_tokens) for r in rows])
    weights = np.array([r.weight for r in rows])
    ridge = Ridge(alpha=l2).fit(x, y, sample_weight=weights)
    predicted = np.clip(ridge.predict(x), 0.0, 1.0)
    mae = float(np.average(np.abs(predicted - y), weights=weights))
    return AcceptanceModel(
        coefficients=tuple(float(c) for c in ridge.coef_),
        intercept=float(ridge.intercept_),
        trained_on=len(rows),
        train_mae=mae,
        num_speculative_tokens=num_speculative_tokens,
    )


def load_acceptance_model(text: str | bytes) -> AcceptanceModel:
    """Parse and check a model file's contents; ModelFileError says what is wrong."""
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"acceptance model is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ModelFileError("acceptance model must be a JSON object")
    schema = doc.get("schema")
    if schema != SCHEMA:
        raise ModelFileError(
            f"acceptance model has schema {schema!r}, this gateway reads {SCHEMA!r}: retrain it"
        )
    features = doc.get("features")
    if features != list(FEATURE_NAMES):
        raise ModelFileError(
            f"acceptance model features {features!r} differ from this gateway's "
            f"{list(FEATURE_NAMES)!r}: retrain it"
        )
    coefficients = doc.get("coefficients")
    if not isinstance(coefficients, list) or len(coefficients) != len(FEATURE_NAMES):
        raise ModelFileError(f"acceptance model needs {len(FEATURE_NAMES)} coefficients")
    numbers = [*coefficients, doc.get("intercept")]
    if not all(_finite(v) for v in numbers):
        raise ModelFileError("acceptance model coefficients and intercept must be finite numbers")
    trained_on, k = doc.get("trained_on", 0), doc.get("num_speculative_tokens", 0)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (trained_on, k)):
        raise ModelFileError("acceptance model: trained_on and num_speculative_tokens must be >= 0")
    mae = doc.get("train_mae", 0.0)
    if not _finite(mae):
        raise ModelFileError("acceptance model: train_mae must be a finite number")
    return AcceptanceModel(
        coefficients=tuple(float(c) for c in coefficients),
        intercept=float(doc["intercept"]),
        trained_on=trained_on,
        train_mae=float(mae),
        num_speculative_tokens=k,
    )


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
