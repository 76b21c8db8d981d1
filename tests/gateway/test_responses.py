"""The Responses API: routed like chat, measured from its own events, and every
request that names a stored response sent to the server that stored it."""

# The fake servers' fixtures come from test_passthrough (conftest.py is shared):
# ruff: noqa: F811

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from classifier.features import Endpoint, Workload, extract_features
from classifier.tokens import TokenCounter
from classifier.types import Route
from gateway.backends.pool import Upstream
from gateway.request.responses import RESPONSE_OWNERS, Owner, ResponseOwners
from tests.gateway.fake_vllm_rest import WORDS, FakeVllmRest
from tests.gateway.test_passthrough import (  # noqa: F401
    RestGateway,
    base_rest,
    rest_gateway,
    rest_servers,
    spec_rest,
)

Client = TestClient[web.Request, web.Application]
SPEC, BASE = {"x-specroute-route": "speculative"}, {"x-specroute-route": "baseline"}


def test_features_read_input_instructions_and_the_answers_length(tokens: TokenCounter) -> None:
    body = {
        "instructions": "Answer briefly.",
        "input": [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "4"}]},
            {"type": "function_call_output", "call_id": "c1", "output": "def f(x):\n  pass"},
        ],
        "max_output_tokens": 33,
    }
    features = extract_features(body, Endpoint.RESPONSES, tokens)
    texts = ["Answer briefly.", "What is 2+2?", "4", "def f(x):\n  pass"]
    assert features.prompt_tokens == sum(tokens.count(t) for t in texts)
    assert features.max_tokens == features.expected_output_tokens == 33
    assert features.workload is Workload.CODE
    plain = extract_features({"input": "hi", "stream": True}, Endpoint.RESPONSES, tokens)
    assert (plain.prompt_tokens, plain.stream, plain.workload) == (1, True, Workload.CHAT)


def test_a_json_schema_text_format_is_structured(tokens: TokenCounter) -> None:
    body = {"input": "x", "text": {"format": {"type": "json_schema", "name": "a", "schema": {}}}}
    assert extract_features(body, Endpoint.RESPONSES, tokens).workload is Workload.STRUCTURED
    body["text"] = {"format": {"type": "text"}}
    assert extract_features(body, Endpoint.RESPONSES, tokens).workload is Workload.CHAT


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"input": 3}, "input"),
        ({"input": ["hi"]}, "input[0]"),
        ({"input": "hi", "max_output_tokens": "9"}, "max_output_tokens"),
        ({"input": "hi", "previous_response_id": 7}, "previous_response_id"),
    ],
)
async def test_bad_bodies_are_400(
    rest_gateway: RestGateway, body: dict[str, Any], param: str
) -> None:
    gateway = await rest_gateway()
    resp = await gateway.post("/v1/responses", json=body)
    assert resp.status == 400
    assert (await resp.json())["error"]["param"] == param


async def test_a_whole_answer_is_relayed_and_measured(
    rest_gateway: RestGateway, base_rest: FakeVllmRest
) -> None:
    gateway = await rest_gateway()
    with capture_logs() as logs:
        resp = await gateway.post("/v1/responses", json={"input": "hi"}, headers=BASE)
    assert resp.status == 200 and resp.headers["x-specroute-route"] == "baseline"
    answer = await resp.json()
    assert answer == base_rest.stored[answer["id"]]
    line = next(e for e in logs if e["event"] == "request")
    assert (line["route"], line["status"], line["completion_tokens"]) == ("baseline", "2xx", 4)
    assert line["prompt_tokens"] == 5


async def test_a_stream_is_relayed_unchanged_and_measured(
    rest_gateway: RestGateway, spec_rest: FakeVllmRest
) -> None:
    gateway = await rest_gateway()
    with capture_logs() as logs:
        resp = await gateway.post(
            "/v1/responses", json={"input": "hi", "stream": True}, headers=SPEC
        )
        raw = await resp.read()
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    events = [e for e in raw.decode().split("\n\n") if e]
    names = [e.split("\n")[0].removeprefix("event: ") for e in events]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    assert names.count("response.output_text.delta") == len(WORDS)
    assert "[DONE]" not in raw.decode()  # the Responses API has none, and gets none
    line = next(e for e in logs if e["event"] == "request")
    assert line["completion_tokens"] == len(WORDS) and line["ttft_s"] is not None
    assert line["stream"] is True and line["status"] == "2xx"
    # Remembered from its events: the stream's response lives on the speculative server.
    response_id = json.loads(events[0].split("data: ", 1)[1])["response"]["id"]
    assert gateway.app[RESPONSE_OWNERS].get(response_id) is not None


async def test_a_continuation_goes_to_the_server_that_stored_it(
    rest_gateway: RestGateway, spec_rest: FakeVllmRest, base_rest: FakeVllmRest
) -> None:
    gateway = await rest_gateway()
    first = await (await gateway.post("/v1/responses", json={"input": "hi"}, headers=BASE)).json()
    # Whatever the router (here: the forced route) prefers, the maker answers.
    resp = await gateway.post(
        "/v1/responses",
        json={"input": "and then?", "previous_response_id": first["id"]},
        headers=SPEC,
    )
    assert resp.status == 200
    assert (resp.headers["x-specroute-route"], resp.headers["x-specroute-reason"]) == (
        "baseline",
        "stored_response",
    )
    assert (await resp.json())["previous_response_id"] == first["id"]
    assert [p for _, p in spec_rest.seen] == []
    got = await gateway.get(f"/v1/responses/{first['id']}", headers=SPEC)
    assert (got.status, (await got.json())["id"]) == (200, first["id"])
    cancelled = await gateway.post(f"/v1/responses/{first['id']}/cancel")
    assert (cancelled.status, (await cancelled.json())["status"]) == (200, "cancelled")
    assert spec_rest.seen == []


async def test_an_id_the_gateway_never_saw_is_found_by_asking(
    rest_gateway: RestGateway,
    rest_servers: tuple[TestServer, TestServer],
    spec_rest: FakeVllmRest,
) -> None:
    gateway = await rest_gateway()
    spec, _ = rest_servers
    direct = str(spec.make_url("/v1/responses"))  # straight to the server
    async with aiohttp.ClientSession() as session, session.post(direct, json={"input": "x"}) as r:
        made = await r.json()
    resp = await gateway.post(
        "/v1/responses", json={"input": "more", "previous_response_id": made["id"]}, headers=BASE
    )
    assert resp.status == 200 and resp.headers["x-specroute-route"] == "speculative"
    owner = gateway.app[RESPONSE_OWNERS].get(made["id"])
    assert owner is not None and owner.route == Route.SPECULATIVE


async def test_an_id_no_server_has_gets_vllms_own_404(rest_gateway: RestGateway) -> None:
    gateway = await rest_gateway()
    for resp in (
        await gateway.get("/v1/responses/resp_nowhere"),
        await gateway.post("/v1/responses/resp_nowhere/cancel"),
        await gateway.post(
            "/v1/responses", json={"input": "x", "previous_response_id": "resp_nowhere"}
        ),
    ):
        assert resp.status == 404
        error = (await resp.json())["error"]
        assert error["message"] == "Response with id 'resp_nowhere' not found."


async def test_a_response_not_stored_gets_its_makers_404(
    rest_gateway: RestGateway, spec_rest: FakeVllmRest, base_rest: FakeVllmRest
) -> None:
    base_rest.store = False  # vLLM without VLLM_ENABLE_RESPONSES_API_STORE
    gateway = await rest_gateway()
    first = await (await gateway.post("/v1/responses", json={"input": "hi"}, headers=BASE)).json()
    assert len(gateway.app[RESPONSE_OWNERS]) == 1  # the answer does not say it was not kept
    resp = await gateway.post(
        "/v1/responses", json={"input": "x", "previous_response_id": first["id"]}, headers=SPEC
    )
    assert resp.status == 404 and resp.headers["x-specroute-route"] == "baseline"
    assert spec_rest.seen == []


async def test_a_continuation_is_not_failed_over_when_its_server_is_down(
    rest_gateway: RestGateway,
    rest_servers: tuple[TestServer, TestServer],
    spec_rest: FakeVllmRest,
) -> None:
    gateway = await rest_gateway()
    first = await (await gateway.post("/v1/responses", json={"input": "hi"}, headers=BASE)).json()
    await rest_servers[1].close()
    resp = await gateway.post(
        "/v1/responses", json={"input": "x", "previous_response_id": first["id"]}
    )
    assert resp.status == 502
    assert spec_rest.seen == []  # the other server has nothing to continue


def test_the_owners_map_is_bounded_and_keeps_the_recently_used() -> None:
    owners = ResponseOwners(limit=2)
    a, b = (
        Owner(Route.SPECULATIVE, Upstream("http://a")),
        Owner(Route.BASELINE, Upstream("http://b")),
    )
    owners.remember("r1", a)
    owners.remember("r2", b)
    assert owners.get("r1") == a  # r1 is now the most recent
    owners.remember("r3", b)
    assert (owners.get("r1"), owners.get("r2"), owners.get("r3"), len(owners)) == (a, None, b, 2)
