"""Fuzzing the request path: whatever arrives, the gateway answers in OpenAI's
shape with a 2xx or a 4xx, never a 5xx of its own, and never hangs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

Client = TestClient[web.Request, web.Application]
ERROR_SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "gateway" / "openapi.json").read_text()
)["components"]["schemas"]["Error"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
KNOWN_KEYS = [
    "model",
    "messages",
    "prompt",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "stream",
    "stream_options",
    "response_format",
    "tools",
    "tool_choice",
    "guided_json",
    "structured_outputs",
    "seed",
]
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool"])},
    optional={"content": json_values, "tool_calls": json_values, "name": json_values},
)
bodies = st.one_of(
    json_values,
    st.dictionaries(st.sampled_from(KNOWN_KEYS), json_values, max_size=8),
    st.fixed_dictionaries(
        {"messages": st.lists(message, min_size=1, max_size=3)},
        optional={k: json_values for k in KNOWN_KEYS if k != "messages"},
    ),
    st.fixed_dictionaries(
        {"prompt": st.one_of(st.text(max_size=40), st.lists(st.integers(0, 50000), max_size=5))},
        optional={k: json_values for k in KNOWN_KEYS if k != "prompt"},
    ),
)


async def _post(gateway: Client, path: str, data: bytes, content_type: str) -> None:
    async with asyncio.timeout(10):  # never a hung connection
        resp = await gateway.post(path, data=data, headers={"Content-Type": content_type})
        payload = await resp.read()
    if resp.status >= 400:
        body = json.loads(payload)
        jsonschema.validate(body, ERROR_SCHEMA)  # the OpenAPI spec's Error (gateway/openapi.json)
        assert set(body["error"]) == {"message", "type", "param", "code"}
    assert resp.status < 500, (resp.status, data[:200], payload[:300])


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=bodies, path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
async def test_json_bodies_never_5xx(gateway: Client, body: Any, path: str) -> None:
    await _post(gateway, path, json.dumps(body).encode(), "application/json")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.binary(max_size=200),
    content_type=st.sampled_from(
        ["application/json", "text/plain", "application/x-www-form-urlencoded", ""]
    ),
)
async def test_arbitrary_bytes_never_5xx(gateway: Client, data: bytes, content_type: str) -> None:
    await _post(gateway, "/v1/chat/completions", data, content_type)
