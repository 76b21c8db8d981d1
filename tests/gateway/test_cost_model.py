"""The cost-model policy inside the gateway: predictions, learning, the trained model file."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from classifier import COST_MODEL_REASONS
from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.cli import main
from gateway.config import ConfigError
from tests.gateway.conftest import GatewayFactory, make_config
from tests.gateway.test_observability import samples
from tests.gateway.test_routing import chat

STRUCTURED = chat(
    "JSON please", temperature=0, response_format={"type": "json_object"}, stream=True
)


async def test_cost_model_predicts_both_routes_and_learns(gateway_for: GatewayFactory) -> None:
    client = await gateway_for(
        routing={"policy": "cost-model", "cost_model": {"explore_share": 0.0}}
    )
    resp = await client.post("/v1/chat/completions", json=STRUCTURED)
    assert resp.status == 200
    await resp.read()
    assert resp.headers["x-specroute-reason"] in COST_MODEL_REASONS
    predicted = dict(p.split("=") for p in resp.headers["x-specroute-predicted"].split(";"))
    assert set(predicted) == {"speculative", "baseline"}
    assert all(float(v) > 0 for v in predicted.values())
    # structured at temperature 0: the priors predict speculation pays
    assert float(predicted["speculative"]) < float(predicted["baseline"])
    assert resp.headers["x-specroute-route"] == "speculative"

    m = samples(await (await client.get("/metrics")).text())
    assert m[("specroute_latency_prediction_ratio_count", (("route", "speculative"),))] == 1
    assert 0 < m[("specroute_estimated_acceptance", (("workload", "structured"),))] <= 1


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
        routing={"policy": "cost-model", "model_path": str(model)},
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
        routing={"policy": "cost-model", "model_path": str(model)},
    )
    with pytest.raises(ConfigError, match=message):
        create_app(config, tokens=tokens)


def test_train_rejects_too_little_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "outcomes.jsonl"
    log.write_text("\n".join(_outcome_lines(3)) + "\n")
    assert main(["train", str(log), "--out", str(tmp_path / "m.json")]) == 2
    assert "at least" in capsys.readouterr().err
