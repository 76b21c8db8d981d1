"""acceptance_model.py: the offline model `specroute train` fits, and its file."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from classifier import Workload
from classifier.acceptance_model import (
    FEATURE_NAMES,
    SCHEMA,
    AcceptanceModel,
    AcceptanceRecord,
    ModelFileError,
    acceptance_features,
    fit_acceptance_model,
    load_acceptance_model,
)
from classifier.speculation import acceptance_rate
from tooling.sim.pair import features

K = 4


# ---- offline model -------------------------------------------------------------------

TRUE_ALPHA = {
    Workload.STRUCTURED: 0.85,
    Workload.CODE: 0.75,
    Workload.CHAT: 0.5,
    Workload.CREATIVE: 0.2,
    Workload.LONG_CONTEXT: 0.55,
}


def synthetic_records(n: int, seed: int) -> list[AcceptanceRecord]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        w = rng.choice(list(Workload))
        t = rng.choice((0.0, 0.3, 0.7, 1.0))
        alpha = min(1.0, max(0.0, TRUE_ALPHA[w] - 0.15 * t + rng.gauss(0, 0.03)))
        rows.append(
            AcceptanceRecord(
                w, w is Workload.CODE, t, rng.randint(10, 5000), acceptance_rate(alpha, K)
            )
        )
    return rows


def test_fit_learns_workload_and_temperature_effects() -> None:
    model = fit_acceptance_model(synthetic_records(2000, 1), num_speculative_tokens=K, l2=0.1)
    assert model.trained_on == 2000 and model.train_mae < 0.05
    for w, alpha in TRUE_ALPHA.items():
        for t in (0.0, 0.7):
            f = features(w, 500, 100, t, code_like=w is Workload.CODE)
            assert model.predict(f) == pytest.approx(alpha - 0.15 * t, abs=0.05), (w, t)


def test_model_file_round_trip() -> None:
    model = fit_acceptance_model(synthetic_records(300, 2), num_speculative_tokens=K)
    text = model.to_json()
    doc = json.loads(text)
    assert doc["schema"] == SCHEMA and doc["features"] == list(FEATURE_NAMES)
    loaded = load_acceptance_model(text)
    assert loaded == model
    assert load_acceptance_model(text.encode()) == model
    f = features(Workload.CODE, 900, 100, 0.2, code_like=True)
    assert loaded.predict(f) == model.predict(f)


def test_inference_is_the_dot_product() -> None:
    model = AcceptanceModel(
        coefficients=tuple(0.01 * i for i in range(len(FEATURE_NAMES))), intercept=0.1
    )
    f = features(Workload.CREATIVE, 700, 100, 1.2)
    x = acceptance_features(f.workload, f.code_like, f.temperature, f.prompt_tokens)
    assert model.predict(f) == pytest.approx(
        0.1 + sum(c * v for c, v in zip(model.coefficients, x, strict=True))
    )


def good_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(AcceptanceModel((0.0,) * len(FEATURE_NAMES), 0.5).to_json())
    return doc


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema="specroute.acceptance-model/0"), "schema"),
        (lambda d: d.pop("schema"), "schema"),
        (lambda d: d.update(features=d["features"][:-1]), "features"),
        (lambda d: d.update(features=list(reversed(d["features"]))), "features"),
        (lambda d: d.update(coefficients=d["coefficients"][:-1]), "coefficients"),
        (lambda d: d.update(coefficients="0.1"), "coefficients"),
        (lambda d: d["coefficients"].__setitem__(0, "x"), "finite"),
        (lambda d: d["coefficients"].__setitem__(0, True), "finite"),
        (lambda d: d.update(intercept=None), "finite"),
        (lambda d: d.update(trained_on=-3), "trained_on"),
        (lambda d: d.update(train_mae="low"), "train_mae"),
    ],
)
def test_bad_model_files_are_refused_clearly(mutate: Any, message: str) -> None:
    doc = good_doc()
    mutate(doc)
    with pytest.raises(ModelFileError, match=message):
        load_acceptance_model(json.dumps(doc))


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", "null", b"\xff\xfe"])
def test_unreadable_model_files(text: str | bytes) -> None:
    with pytest.raises(ModelFileError, match="acceptance model"):
        load_acceptance_model(text)


def test_nan_coefficients_are_refused() -> None:
    text = good_doc()
    text["coefficients"][2] = float("nan")
    with pytest.raises(ModelFileError, match="finite"):
        load_acceptance_model(json.dumps(text))  # json writes NaN, and reads it back


def test_fit_needs_enough_records() -> None:
    with pytest.raises(ValueError, match="at least"):
        fit_acceptance_model(synthetic_records(5, 3), num_speculative_tokens=K)


def test_records_from_outcome_log_objects() -> None:
    row = {
        "workload": "code",
        "code_like": True,
        "temperature": 0.2,
        "prompt_tokens": 812,
        "acceptance": 0.61,
    }
    assert AcceptanceRecord.from_mapping(row) == AcceptanceRecord(
        Workload.CODE, True, 0.2, 812, 0.61
    )
    with pytest.raises(ValueError, match="lacks 'acceptance'"):
        AcceptanceRecord.from_mapping({k: v for k, v in row.items() if k != "acceptance"})
    with pytest.raises(ValueError, match="workload"):
        AcceptanceRecord.from_mapping({**row, "workload": "poetry"})
    with pytest.raises(ValueError, match="prompt_tokens"):
        AcceptanceRecord.from_mapping({**row, "prompt_tokens": 1.5})
    with pytest.raises(ValueError, match="code_like"):
        AcceptanceRecord.from_mapping({**row, "code_like": 1})
