"""acceptance.py and acceptance_model.py: online estimates, back-off, and the model file."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from costmodel_sim import features

from classifier import Workload
from classifier.acceptance import (
    NEUTRAL_ACCEPTANCE,
    AcceptanceEstimator,
    AcceptancePriors,
    prompt_bucket,
    temperature_bucket,
)
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
from tooling.emulator.config import EmulatorConfig

K = 4
PRIORS = AcceptancePriors()


def chat(temperature: float = 0.7, prompt: int = 300, code_like: bool = False) -> Any:
    return features(Workload.CHAT, prompt, 200, temperature, code_like=code_like)


def test_buckets() -> None:
    assert [temperature_bucket(t) for t in (0.0, 0.05, 0.2, 0.5, 0.7, 1.0, 1.3)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
    ]
    assert [prompt_bucket(n) for n in (0, 255, 256, 1023, 1024, 4095, 4096)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
    ]


def test_default_priors_are_neutral_and_not_the_emulators_truth() -> None:
    """Two sources that must differ: the router's priors are one neutral value
    (classifier/acceptance.py), the emulator's truth is CALIBRATION.md's per-kind
    levels. A learning result that holds only where they agree shows nothing."""
    assert {PRIORS.of(w) for w in Workload} == {NEUTRAL_ACCEPTANCE}
    emulator = EmulatorConfig(mode="speculative")
    truth = {
        Workload.STRUCTURED: emulator.acceptance_structured,
        Workload.CODE: emulator.acceptance_code,
        Workload.CHAT: emulator.acceptance_chat,
        Workload.CREATIVE: emulator.acceptance_creative,
    }
    gaps = {w: round(PRIORS.of(w) - a, 9) for w, a in truth.items()}
    assert all(abs(gap) >= 0.1 for gap in gaps.values()), gaps
    assert min(gaps.values()) <= -0.2 and max(gaps.values()) >= 0.2, gaps


def test_starts_at_the_config_prior() -> None:
    est = AcceptanceEstimator(AcceptancePriors(chat=0.42), K)
    assert est.predict(chat()) == 0.42
    assert est.by_workload()[Workload.CHAT] == 0.42
    assert est.samples()[Workload.CHAT] == 0.0


@pytest.mark.parametrize("truth", [0.1, 0.45, 0.9])
def test_converges_per_workload_from_a_wrong_prior(truth: float) -> None:
    rng = random.Random(1)
    est = AcceptanceEstimator(AcceptancePriors(chat=0.5, creative=0.5), K)
    for _ in range(300):
        alpha = min(1.0, max(0.0, truth + rng.uniform(-0.05, 0.05)))
        rate = acceptance_rate(alpha, K) + rng.gauss(0, 0.03)  # vLLM's accepted / proposed
        est.observe(chat(rng.choice((0.2, 0.7, 1.0)), rng.randint(10, 3000)), rate)
    assert est.by_workload()[Workload.CHAT] == pytest.approx(truth, abs=0.05)
    assert est.predict(chat()) == pytest.approx(truth, abs=0.05)
    assert est.by_workload()[Workload.CREATIVE] == 0.5  # other workloads untouched


def test_fine_keys_learn_their_own_value_and_back_off_when_sparse() -> None:
    est = AcceptanceEstimator(PRIORS, K)
    for _ in range(400):  # greedy chat accepts far more than warm chat
        est.observe(chat(0.0), acceptance_rate(0.9, K))
        est.observe(chat(0.9), acceptance_rate(0.3, K))
    assert est.predict(chat(0.0)) == pytest.approx(0.9, abs=0.03)
    assert est.predict(chat(0.9)) == pytest.approx(0.3, abs=0.03)
    # An unseen fine key (above-1 temperature) falls back to the workload's level.
    assert est.predict(chat(1.5)) == pytest.approx(est.by_workload()[Workload.CHAT], abs=1e-9)
    # One sample in a new prompt bucket moves it only part of the way.
    long = chat(0.0, prompt=5000)
    est.observe(long, acceptance_rate(0.1, K))
    assert 0.6 < est.predict(long) < 0.9


def test_ignores_nonsense() -> None:
    est = AcceptanceEstimator(PRIORS, K)
    for bad in (math.nan, math.inf):
        est.observe(chat(), bad)
    est.observe(chat(), 0.5, weight=0.0)
    assert est.samples()[Workload.CHAT] == 0.0


def test_priors_are_validated() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        AcceptancePriors(code=1.2)
    with pytest.raises(ValueError, match="prior_weight"):
        AcceptancePriors(prior_weight=0)


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


def test_estimator_uses_the_model_as_its_base_and_corrects_it() -> None:
    model = AcceptanceModel(coefficients=(0.0,) * len(FEATURE_NAMES), intercept=0.3)
    est = AcceptanceEstimator(PRIORS, K, model)
    assert est.predict(chat()) == pytest.approx(0.3)
    for _ in range(300):
        est.observe(chat(), acceptance_rate(0.6, K))
    assert est.predict(chat()) == pytest.approx(0.6, abs=0.03)
    assert est.by_workload()[Workload.CHAT] == pytest.approx(0.6, abs=0.03)


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
