"""Bad input reaches the picker: the gateway's 4xx in OpenAI's shape, as Envoy's
ImmediateResponse; never a 500, never a backend."""

from __future__ import annotations

import aiohttp
import pytest

from tests.extproc.conftest import StackFactory
from tooling.envoy import chat, emulator_state, metric

LIMIT = 2048
JSON = {"content-type": "application/json"}
CASES = [
    # (what, body, headers, status, param or message fragment)
    ("not JSON", b"{not json", JSON, 400, "not valid JSON"),
    ("no body", b"", JSON, 400, "not valid JSON"),
    ("not an object", b"[1, 2]", JSON, 400, "must be a JSON object"),
    ("no messages", b'{"model": "m"}', JSON, 400, "messages"),
    (
        "wrong type",
        b'{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":"many"}',
        JSON,
        400,
        "max_tokens",
    ),
    ("text/plain", b"{}", {"content-type": "text/plain"}, 415, "unsupported content type"),
    ("too big", b'{"x": "' + b"a" * (2 * LIMIT) + b'"}', JSON, 413, "over 2048 bytes"),
    ("bad route header", None, {**JSON, "x-specroute-route": "fastest"}, 400, "x-specroute-route"),
]


@pytest.mark.parametrize(
    ("what", "body", "headers", "status", "says"), CASES, ids=[c[0] for c in CASES]
)
async def test_refused_in_openai_shape(
    stack_for: StackFactory,
    what: str,
    body: bytes | None,
    headers: dict[str, str],
    status: int,
    says: str,
) -> None:
    stack = await stack_for(server={"max_body_bytes": LIMIT})
    data = body if body is not None else aiohttp.JsonPayload(chat())
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{stack.envoy.url}/v1/chat/completions", data=data, headers=headers) as r,
    ):
        assert r.status == status
        assert r.headers["content-type"] == "application/json"
        assert r.headers["x-request-id"]
        error = (await r.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] in ("invalid_request_error",)
    assert says in error["message"] or says == error["param"]
    assert (await emulator_state(stack.spec_url))["submitted"] == 0
    assert (await emulator_state(stack.base_url))["submitted"] == 0
    picker = stack.picker.http_url
    assert await metric(picker, "specroute_requests_total", status=f"{status // 100}xx") == 1
    assert await metric(picker, "specroute_inflight_requests") == 0
