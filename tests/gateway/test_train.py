"""`specroute train` and the model file the profiled policy takes its acceptance prior from."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.cli import main
from gateway.config import ConfigError
from tests.gateway.conftest import make_config


def _outcome_lines(n: int) -> list[str]:
    rng = random.Random(1)
    lines = []
    for i in range(n):
        workload = ["structured", "creative", "code"][i % 3]
        truth = {"structured": 0.7, "creative": 0.15, "code": 0.55}[workload]
        features = {
            "workload": workload,
            "code_like": workload == "code",
            "temperature": 0.0 if workload != "creative" else 1.2,
            "prompt_tokens": rng.randint(20, 400),
        }
        lines.append(
            json.dumps(
                {
                    "route": "speculative",
                    "status": "2xx",
                    "features": features,
                    "acceptance": truth + rng.uniform(-0.05, 0.05),
                    "completion_tokens": 100,
                }
            )
        )
    lines.append(
        json.dumps({"route": "baseline", "status": "2xx", "features": {}, "acceptance": None})
    )
    return lines


def test_train_writes_a_model_the_gateway_loads(
    tmp_path: Path, tokens: TokenCounter, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "outcomes.jsonl"
    log.write_text("\n".join(_outcome_lines(60)) + "\n")
    model = tmp_path / "model.json"
    assert main(["train", str(log), "--out", str(model)]) == 0
    out = capsys.readouterr().out
    assert "trained on 60 speculative requests" in out
    assert json.loads(model.read_text())["features"]

    config = make_config(
        "http://127.0.0.1:1",
        "http://127.0.0.1:2",
        routing={"policy": "profiled", "model_path": str(model)},
    )
    create_app(config, tokens=tokens)  # loads without error


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "routing.model_path"),
        ('{"schema": "other"}', "retrain"),
        (None, "cannot read"),
    ],
)
def test_a_bad_model_file_is_a_clear_startup_error(
    tmp_path: Path, tokens: TokenCounter, content: str | None, message: str
) -> None:
    model = tmp_path / "model.json"
    if content is not None:
        model.write_text(content)
    config = make_config(
        "http://127.0.0.1:1",
        "http://127.0.0.1:2",
        routing={"policy": "profiled", "model_path": str(model)},
    )
    with pytest.raises(ConfigError, match=message):
        create_app(config, tokens=tokens)


def test_train_rejects_too_little_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "outcomes.jsonl"
    log.write_text("\n".join(_outcome_lines(3)) + "\n")
    assert main(["train", str(log), "--out", str(tmp_path / "m.json")]) == 2
    assert "at least" in capsys.readouterr().err
