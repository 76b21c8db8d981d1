"""The outcome log: one JSON line per request, bounded, no prompt text unless asked; a
path it cannot use is refused at start, and nothing it meets later stops it silently."""

from __future__ import annotations

import functools
import io
import json
import math
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.cli import main
from gateway.config import ConfigError
from gateway.outcomes.outcome_log import OutcomeLog
from gateway.state import METRICS
from gateway.telemetry import Metrics
from tests.gateway.conftest import ClientFactory, GatewayFactory, make_config
from tests.gateway.test_routing import chat
from tests.support import wait_until

SECRET = "the-secret-prompt-words"


async def _run(
    aiohttp_client: ClientFactory,
    spec_server: TestServer,
    base_server: TestServer,
    tokens: TokenCounter,
    path: Path,
    include_prompts: bool,
) -> list[dict[str, object]]:
    config = make_config(
        str(spec_server.make_url("")),
        str(base_server.make_url("")),
        outcome_log={"path": str(path), "include_prompts": include_prompts},
    )
    client = await aiohttp_client(create_app(config, tokens=tokens))
    json_body = chat(SECRET, temperature=0, response_format={"type": "json_object"}, stream=True)
    await (await client.post("/v1/chat/completions", json=json_body)).read()
    await (await client.post("/v1/chat/completions", json=chat(SECRET, temperature=1.3))).read()
    await (await client.post("/v1/chat/completions", data=b"{oops")).read()
    await client.close()  # runs the app's cleanup: the log is flushed and closed
    return [json.loads(line) for line in read(path).splitlines()]


def read(path: Path) -> str:
    return path.read_text()


async def test_outcome_log_records_each_routed_request_without_prompts(
    aiohttp_client: ClientFactory,
    spec_server: TestServer,
    base_server: TestServer,
    tokens: TokenCounter,
    tmp_path: Path,
) -> None:
    path = tmp_path / "outcomes.jsonl"
    records = await _run(aiohttp_client, spec_server, base_server, tokens, path, False)
    assert [r["route"] for r in records] == ["speculative", "baseline"]  # the 400 was never routed
    first = records[0]
    assert first["reason"] == "structured-low-temp"
    assert first["status"] == "2xx" and first["completion_tokens"] == 6
    assert first["features"]["workload"] == "structured"  # type: ignore[index]
    assert first["batch"] == 1
    assert first["acceptance_source"] == "stream_steps"
    assert SECRET not in read(path)


async def test_outcome_log_includes_prompts_only_when_enabled(
    aiohttp_client: ClientFactory,
    spec_server: TestServer,
    base_server: TestServer,
    tokens: TokenCounter,
    tmp_path: Path,
) -> None:
    path = tmp_path / "outcomes.jsonl"
    records = await _run(aiohttp_client, spec_server, base_server, tokens, path, True)
    assert records[0]["prompt"] == [{"role": "user", "content": SECRET}]


def test_outcome_log_rotates_and_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    log = OutcomeLog(path, max_bytes=1000, backups=2)
    for i in range(200):
        log.write({"i": i, "pad": "x" * 40})
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["o.jsonl", "o.jsonl.1", "o.jsonl.2"]
    assert all((tmp_path / f).stat().st_size < 1100 for f in files)
    last = [json.loads(line)["i"] for line in path.read_text().splitlines()]
    assert last[-1] == 199 and log.written == 200


def test_outcome_log_drops_and_counts_when_its_queue_is_full(tmp_path: Path) -> None:
    log = OutcomeLog(tmp_path / "o.jsonl", max_bytes=10**6, backups=1, queue_size=1)
    for i in range(2000):
        log.write({"i": i})
    log.close()
    assert log.dropped > 0
    assert log.written + log.dropped == 2000


# ---- nothing the writer meets ends it, blocks it or goes unsaid (issue 50) -------------


def _settle(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    """Wait for the writer thread (a plain test: no loop to poll on)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, (name, labels)
    return value


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("dir", "is a directory"),
        ("fifo", "not a regular file"),
        ("/dev/full", "not a regular file"),
        ("dir/missing/o.jsonl", "does not exist"),
    ],
)
def test_an_unusable_outcome_log_path_is_a_config_error_in_one_line(
    tmp_path: Path, fifo: Path, target: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The writer used to die (a directory), block on its open (a FIFO) or lose every
    line (/dev/full) after the gateway had started without a word."""
    (tmp_path / "dir").mkdir()
    path = target if target.startswith("/") else str(tmp_path / target)
    config = tmp_path / "config.toml"
    config.write_text(
        '[backends]\nspeculative.urls = ["http://a:1"]\nbaseline.urls = ["http://b:2"]\n'
        f"[outcome_log]\npath = {json.dumps(path)}\n"
    )
    started = time.monotonic()
    assert main(["config", "--check", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"outcome_log.path = {path!r}: " in err and why in err
    with pytest.raises(ConfigError, match=why):  # and at start: serve reads the same way
        make_config("http://a:1", "http://b:2", outcome_log={"path": path})
    assert time.monotonic() - started < 5


class _FullDisk(OutcomeLog):
    """A log whose file is /dev/full (every write: ENOSPC) while `full` is set: the
    config refuses that path, so the test opens it under the writer."""

    full = True

    def _open_file(self) -> io.FileIO:
        if self.full:
            return open("/dev/full", "ab", buffering=0)
        return super()._open_file()


def test_a_write_that_fails_is_counted_and_said_once_and_the_writer_goes_on(
    tmp_path: Path,
) -> None:
    metrics = Metrics()
    path = tmp_path / "o.jsonl"
    with capture_logs() as logs:
        log = _FullDisk(path, max_bytes=10**6, backups=1, metrics=metrics)
        for i in range(5):
            log.write({"i": i})
        _settle(lambda: log.dropped == 5, "five failed writes")
        log.full = False
        for i in range(5, 8):
            log.write({"i": i})
        log.close()
    assert [json.loads(line)["i"] for line in path.read_text().splitlines()] == [5, 6, 7]
    failed = [e for e in logs if e["event"] == "outcome_log_write_failed"]
    assert len(failed) == 1 and "No space left on device" in failed[0]["error"]
    (again,) = [e for e in logs if e["event"] == "outcome_log_writing_again"]
    assert again["lost"] == 5
    assert log.write_failures == 5 and log.written == 3
    assert _sample(metrics, "specroute_outcome_log_write_failures_total", log="outcomes") == 5
    dropped = "specroute_outcome_log_dropped_total"
    assert _sample(metrics, dropped, log="outcomes", reason="write_failed") == 5
    assert _sample(metrics, dropped, log="outcomes", reason="queue_full") == 0


def test_a_line_json_cannot_hold_is_skipped_counted_and_the_next_is_written(
    tmp_path: Path,
) -> None:
    metrics = Metrics()
    path = tmp_path / "o.jsonl"
    deep: list[Any] = []
    for _ in range(1010):
        deep = [deep]
    with capture_logs() as logs:
        log = OutcomeLog(path, max_bytes=10**6, backups=1, metrics=metrics)
        for record in ({"prompt": deep}, {"x": math.nan}, {"x": math.inf}, {"i": 1}):
            log.write(record)
        log.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"i": 1}]
    dropped = "specroute_outcome_log_dropped_total"
    assert _sample(metrics, dropped, log="outcomes", reason="unserializable") == 3
    assert len([e for e in logs if e["event"] == "outcome_log_line_skipped"]) == 1


async def test_a_prompt_nested_1010_deep_is_skipped_and_the_gateway_logs_on(
    gateway_for: GatewayFactory, tmp_path: Path
) -> None:
    """With include_prompts, one such prompt (orjson parses bodies of 64 KiB and more
    up to 1024 deep, json.dumps recurses less far) used to end the writer thread: every
    later line was lost without a word."""
    path = tmp_path / "outcomes.jsonl"
    client = await gateway_for(outcome_log={"path": str(path), "include_prompts": True})
    deep = "[" * 1010 + "]" * 1010
    padding = "x" * 70_000  # past the fast parser's threshold
    body = f'{{"model":"m","messages":[{{"role":"user","content":"{padding}","n":{deep}}}]}}'
    with capture_logs() as logs:
        answered = await client.post(
            "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        await answered.read()  # the fake upstream's parser refuses the nesting: its 500
        normal = await client.post("/v1/chat/completions", json=chat("next"))
        assert normal.status == 200, await normal.text()
        metrics = client.app[METRICS]
        await client.close()
    lines = [json.loads(line) for line in read(path).splitlines()]
    assert [line["prompt"] for line in lines] == [[{"role": "user", "content": "next"}]]
    dropped = "specroute_outcome_log_dropped_total"
    assert _sample(metrics, dropped, log="outcomes", reason="unserializable") == 1
    assert [e["event"] for e in logs if e["event"].startswith("outcome_log")] == [
        "outcome_log_line_skipped"
    ]


async def test_a_log_whose_directory_is_removed_says_so_once_and_the_gateway_answers(
    gateway_for: GatewayFactory, tmp_path: Path
) -> None:
    """The writer held the unlinked file and wrote on into it: every line lost, unsaid."""
    logs_dir = tmp_path / "logs"
    logs_dir.mkdir()
    client = await gateway_for(outcome_log={"path": str(logs_dir / "outcomes.jsonl")})
    metrics = client.app[METRICS]
    failures = "specroute_outcome_log_write_failures_total"

    async def answered() -> bool:
        response = await client.post("/v1/chat/completions", json=chat("hi"))
        assert response.status == 200, await response.text()
        return _sample(metrics, failures, log="outcomes") > 0

    with capture_logs() as logs:
        await answered()
        await wait_until(lambda: (logs_dir / "outcomes.jsonl").exists(), "the first line")
        shutil.rmtree(logs_dir)
        await wait_until(answered, "a failed write counted", timeout_s=10, interval_s=0.1)
        for _ in range(3):
            await answered()
        await client.close()
    assert len([e for e in logs if e["event"] == "outcome_log_write_failed"]) == 1
    dropped = "specroute_outcome_log_dropped_total"
    assert _sample(metrics, dropped, log="outcomes", reason="write_failed") >= 4


class _StuckDisk(OutcomeLog):
    """A log written into a pipe no one reads: once its 64 KiB are full, the write
    blocks, as on a hung mount."""

    def __init__(self, pipe: int, *args: Any, **kwargs: Any) -> None:
        self._pipe = pipe
        super().__init__(*args, **kwargs)

    def _open_file(self) -> io.FileIO:
        return open(self._pipe, "wb", buffering=0, closefd=False)


def test_close_returns_in_bounded_time_whatever_is_queued(tmp_path: Path) -> None:
    """close() used to put its stop mark with a blocking put: behind a full queue and a
    writer that no longer took from it, SIGTERM never finished."""
    metrics = Metrics()
    read_end, write_end = os.pipe()
    log = _StuckDisk(write_end, tmp_path / "o.jsonl", max_bytes=10**9, backups=1, metrics=metrics)
    try:
        for i in range(10_000):
            log.write({"i": i, "pad": "x" * 100})
        closing = threading.Thread(target=functools.partial(log.close, timeout_s=0.5))
        started = time.monotonic()
        closing.start()
        closing.join(timeout=5.0)
        assert not closing.is_alive() and time.monotonic() - started < 3.0
    finally:
        os.close(read_end)  # the stuck write fails (EPIPE) and the writer ends
        log._thread.join(timeout=5.0)
        os.close(write_end)
    assert not log._thread.is_alive()
    shutdown = _sample(
        metrics, "specroute_outcome_log_dropped_total", log="outcomes", reason="shutdown"
    )
    assert shutdown > 9_000
    assert log.written + log.dropped >= 9_999  # the line in the stuck write: either
