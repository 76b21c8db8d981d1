"""The gateway in front of the real CPU vLLM pair: routing, passthrough, measurement.

Needs SPECROUTE_VLLM_BACKENDS (deploy/cpu/run_tier.sh sets it); without it the
tests skip, or fail in CI. The gateway runs in-process (the same create_app as
`specroute serve`); the servers are real vLLM with n-gram speculation and
per-request metrics on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
from structlog.testing import capture_logs

from classifier.tokens import load_tiktoken_counter
from gateway.app import create_app
from gateway.config import parse_config
from tests.support import wait_until
from tooling.local_stack import serve_app

pytestmark = pytest.mark.vllm

COPY = 'Copy this JSON exactly: {"name": "Ada", "born": 1815, "field": "mathematics"}'
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "born": {"type": "integer"}},
    "required": ["name", "born"],
}
DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


@pytest.fixture
async def gateway_url(backends: Any) -> AsyncIterator[str]:
    """The gateway under the production runner settings, on an ephemeral port."""
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
    runner, url = await serve_app(create_app(config, tokens=load_tiktoken_counter()))
    try:
        yield url
    finally:
        await runner.cleanup()


@pytest.fixture
async def sdk(gateway_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0, timeout=120
    ) as client:
        yield client


async def test_models_through_the_gateway(sdk: openai.AsyncOpenAI, backends: Any) -> None:
    models = await sdk.models.list()
    assert [m.id for m in models.data] == [backends.model]


async def test_structured_request_goes_speculative_and_is_valid_json(
    sdk: openai.AsyncOpenAI, backends: Any
) -> None:
    raw = await sdk.chat.completions.with_raw_response.create(
        model=backends.model,
        messages=[{"role": "user", "content": "Return Ada Lovelace's name and birth year."}],
        temperature=0,
        max_tokens=40,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": SCHEMA},
        },
    )
    assert raw.headers["x-specroute-route"] == "speculative"
    assert raw.headers["x-specroute-reason"] == "structured-low-temp"
    reply = raw.parse()
    parsed = json.loads(reply.choices[0].message.content or "")
    assert set(parsed) >= {"name", "born"}


async def test_hot_request_goes_baseline_and_streams(
    sdk: openai.AsyncOpenAI, backends: Any
) -> None:
    raw = await sdk.chat.completions.with_raw_response.create(
        model=backends.model,
        messages=[{"role": "user", "content": "Write a short poem about rain."}],
        temperature=1.3,
        max_tokens=16,
        stream=True,
    )
    assert raw.headers["x-specroute-route"] == "baseline"
    chunks = [c async for c in raw.parse()]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert all(c.usage is None for c in chunks)  # the usage chunk the gateway asked for is gone


async def test_completions_through_the_gateway(sdk: openai.AsyncOpenAI, backends: Any) -> None:
    completion = await sdk.completions.create(
        model=backends.model, prompt="def add(a, b):\n    return", max_tokens=8, temperature=0
    )
    assert completion.choices[0].text
    stream = await sdk.completions.create(
        model=backends.model, prompt="SELECT name FROM", max_tokens=8, temperature=0, stream=True
    )
    assert "".join([c.choices[0].text async for c in stream if c.choices])


async def _settled(
    scrape: Callable[[str], Awaitable[Any]], url: str, name: str, floor: float
) -> Any:
    """vLLM publishes its stats a moment after the answer: wait for the counter to move."""

    async def moved() -> Any:
        now = await scrape(url)
        return now if now.get(name) > floor else None

    return await wait_until(moved, f"{name} above {floor} on {url}", interval_s=0.1)


async def test_counters_move_only_where_the_request_was_routed_and_acceptance_agrees(
    gateway_url: str,
    http: aiohttp.ClientSession,
    scrape: Callable[[str], Awaitable[Any]],
    backends: Any,
) -> None:
    body = {
        "model": backends.model,
        "messages": [{"role": "user", "content": COPY}],
        "temperature": 0,
        "max_tokens": 40,
        "stream": True,
    }
    spec_before = await scrape(backends.speculative)
    async with http.post(
        f"{gateway_url}/v1/chat/completions", json=body, headers={"x-specroute-route": "baseline"}
    ) as resp:
        assert resp.headers["x-specroute-route"] == "baseline"
        await resp.read()
    await asyncio.sleep(0.5)  # a window in which the speculative server must draft nothing
    spec_mid = await scrape(backends.speculative)
    assert spec_mid.get(DRAFTED) == spec_before.get(DRAFTED)

    with capture_logs() as logs:
        async with http.post(
            f"{gateway_url}/v1/chat/completions",
            json=body,
            headers={"x-specroute-route": "speculative"},
        ) as resp:
            assert resp.headers["x-specroute-route"] == "speculative"
            streamed = await resp.read()
    assert b'"usage"' not in streamed  # the client did not ask for usage
    spec_after = await _settled(scrape, backends.speculative, DRAFTED, spec_mid.get(DRAFTED))
    drafted = spec_after.get(DRAFTED) - spec_mid.get(DRAFTED)
    accepted = spec_after.get(ACCEPTED) - spec_mid.get(ACCEPTED)
    assert drafted > 0
    line = next(e for e in logs if e["event"] == "request")
    assert line["acceptance_source"] == "per_request_metrics"
    assert line["acceptance"] == pytest.approx(accepted / drafted, abs=1e-6)
    # What the router learns counts every decode step, those that drafted nothing too:
    # after the first token each step yields 1 + its accepted drafts.
    tokens = line["completion_tokens"]
    assert line["acceptance_length"] == pytest.approx(
        (tokens - 1) / (tokens - 1 - accepted), abs=1e-3
    )


async def test_client_disconnect_through_the_gateway_aborts_in_vllm(
    gateway_url: str,
    http: aiohttp.ClientSession,
    scrape: Callable[[str], Awaitable[Any]],
    backends: Any,
) -> None:
    body = {
        "model": backends.model,
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 1500,
        "temperature": 1.0,
        "ignore_eos": True,
        "stream": True,
    }
    resp = await http.post(
        f"{gateway_url}/v1/chat/completions", json=body, headers={"x-specroute-route": "baseline"}
    )
    for _ in range(5):
        await resp.content.readline()
    assert (await scrape(backends.baseline)).get("vllm:num_requests_running") == 1
    resp.close()  # the client goes away; the gateway must close its upstream request

    async def stopped() -> bool:
        return (await scrape(backends.baseline)).get("vllm:num_requests_running") == 0

    await wait_until(stopped, "vLLM to stop generating after the client left", timeout_s=5)
    frozen = (await scrape(backends.baseline)).get("vllm:generation_tokens_total")
    await asyncio.sleep(0.5)  # a window in which no token may be generated
    assert (await scrape(backends.baseline)).get("vllm:generation_tokens_total") == frozen
