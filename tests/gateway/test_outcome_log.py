"""The outcome log: one JSON line per request, bounded, no prompt text unless asked."""

from __future__ import annotations

import json
from pathlib import Path

from aiohttp.test_utils import TestServer

from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.outcomes.outcome_log import OutcomeLog
from tests.gateway.conftest import ClientFactory, make_config
from tests.gateway.test_routing import chat

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
