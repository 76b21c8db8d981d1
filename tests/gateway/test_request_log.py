"""The one log line per request: refusals that no handler logged get theirs, a
generation request gets exactly one, and its first token is the one the bench measures."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from classifier.tokens import TokenCounter
from gateway.app import create_app
from tests.gateway.conftest import GatewayFactory, ServerFactory, make_config
from tests.gateway.fake_upstream import backend_app
from tooling.loadgen import send_one
from tooling.workloads import Request

Client = TestClient[web.Request, web.Application]


async def test_refusals_leave_one_log_line(gateway_for: GatewayFactory, monkeypatch: Any) -> None:
    monkeypatch.setenv("SPECROUTE_TEST_KEYS", "k1")
    gateway = await gateway_for(auth={"api_keys_env": "SPECROUTE_TEST_KEYS"})
    with capture_logs() as logs:
        unauthorized = await gateway.post("/v1/chat/completions", json={}, headers={"X": "y"})
        missing = await gateway.get("/v1/nothing-here", headers={"Authorization": "Bearer k1"})
    assert (unauthorized.status, missing.status) == (401, 404)
    lines = [e for e in logs if e["event"] == "request"]
    assert [(e["http_status"], e["path"]) for e in lines] == [
        (401, "/v1/chat/completions"),
        (404, "/v1/nothing-here"),
    ]
    assert all(e["status"] == "4xx" and e["request_id"] for e in lines)


async def test_generation_requests_still_log_exactly_once(gateway: Client) -> None:
    with capture_logs() as logs:
        resp = await gateway.post("/v1/chat/completions", data=b"{bad")
    assert resp.status == 400
    assert len([e for e in logs if e["event"] == "request"]) == 1


def _reasoning_then_content(delay_s: float) -> web.Application:
    """A backend whose first token is reasoning, and whose content comes much later."""

    async def generate(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        head = {"id": "r-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        deltas = [{"role": "assistant", "content": ""}, {"reasoning_content": "Let me think"}]
        for delta in deltas:
            choice = {"index": 0, "delta": delta, "finish_reason": None}
            await response.write(b"data: " + json.dumps({**head, "choices": [choice]}).encode())
            await response.write(b"\n\n")
        await asyncio.sleep(delay_s)  # the thinking the test must not count twice
        last = {"index": 0, "delta": {"content": "42"}, "finish_reason": "stop"}
        usage = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
        for event in ({**head, "choices": [last]}, {**head, "choices": [], "usage": usage}):
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    return backend_app(generate)


async def test_bench_and_gateway_share_one_first_token_definition(
    aiohttp_server: ServerFactory, tokens: TokenCounter
) -> None:
    delay = 0.4
    backend: TestServer = await aiohttp_server(_reasoning_then_content(delay))
    url = str(backend.make_url(""))
    gateway: TestServer = await aiohttp_server(create_app(make_config(url, url), tokens=tokens))
    request = Request(
        "reasoning", "chat", {"model": "m", "messages": [{"role": "user", "content": "q"}]}
    )
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            result = await send_one(session, str(gateway.make_url("")), request)
    (line,) = [e for e in logs if e["event"] == "request"]
    assert result.ok and result.ttft_s is not None and line["ttft_s"] is not None
    assert line["ttft_s"] < delay and result.ttft_s < delay
