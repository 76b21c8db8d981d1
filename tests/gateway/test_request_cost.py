"""The gateway's own cost per request (issue 53): what the CPU profile paid for stays paid.

docs/benchmarks.md ("Where a request's CPU goes") measured each of these; the tests
pin the behaviour each cut keeps: the log line's JSON, the metrics' children, the answer's
parse (no span work with tracing off or sampled out: tests/gateway/test_tracing.py).
"""

from __future__ import annotations

import enum
import json

import pytest
import structlog
from prometheus_client import generate_latest

from gateway.telemetry import Metrics, configure_logging
from gateway.wire.proxy import loads_object


class Color(enum.StrEnum):
    RED = "red"


def test_the_log_line_is_one_json_object_each_way(capsys: pytest.CaptureFixture[str]) -> None:
    """orjson writes the plain line; a line with non-ASCII text, or an int orjson refuses,
    is json.dumps's as before (\\u escapes: no stderr's encoding can refuse it)."""
    configure_logging("info")
    log = structlog.get_logger("specroute.test")
    log.info("plain", route="speculative", why={Color.RED: 1.5}, n=3, nothing=None)
    log.info("accented", detail="caf\u00e9 \u2603")
    log.info("huge", count=2**70)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines
    plain, accented, huge = (json.loads(line) for line in lines)
    assert plain["event"] == "plain" and plain["why"] == {"red": 1.5} and plain["n"] == 3
    assert plain["nothing"] is None and plain["level"] == "info" and "timestamp" in plain
    assert accented["detail"] == "caf\u00e9 \u2603" and lines[1].isascii()
    assert "\\u00e9" in lines[1]
    assert huge["count"] == 2**70


def test_a_metrics_child_is_looked_up_once_made() -> None:
    """labels() returns the same child for a label set seen before, and each update
    still reaches the exposition; values that are not strings still name the series."""
    metrics = Metrics()
    first = metrics.requests.labels("speculative", "chat", "2xx")
    assert metrics.requests.labels("speculative", "chat", "2xx") is first
    first.inc()
    metrics.requests.labels("speculative", "chat", "2xx").inc()
    metrics.duration.labels("speculative", "chat").observe(0.2)
    metrics.decisions.labels("speculative", 7).inc()  # an int: str() as before
    assert metrics.decisions.labels("speculative", "7") is metrics.decisions.labels(
        "speculative", 7
    )
    text = generate_latest(metrics.registry).decode()
    assert 'specroute_requests_total{route="speculative",status="2xx",workload="chat"} 2.0' in text
    assert 'specroute_route_decisions_total{reason="7",route="speculative"} 1.0' in text
    assert 'specroute_request_duration_seconds_count{route="speculative",workload="chat"} 1.0' in (
        text
    )
    metrics.requests.remove("speculative", "chat", "2xx")
    assert metrics.requests.labels("speculative", "chat", "2xx") is not first
    with pytest.raises(ValueError, match="Incorrect label count"):
        metrics.requests.labels("speculative")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"usage": {"completion_tokens": 3}}', {"usage": {"completion_tokens": 3}}),
        (b'{"x": NaN}', "nan"),  # json's, as before: orjson refuses it
        (b'{"s": "\\ud800"}', {"s": "\ud800"}),  # a lone surrogate: json's too
        (b"[1, 2]", None),
        (b"{broken", None),
        (b"", None),
    ],
)
def test_an_answer_parses_as_before(raw: bytes, expected: object) -> None:
    parsed = loads_object(raw)
    if expected == "nan":
        assert parsed is not None and parsed["x"] != parsed["x"]
    else:
        assert parsed == expected
