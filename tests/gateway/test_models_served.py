"""Every route serves the model: two servers under different `--served-model-name`
values behind one gateway. /ready said ready, /v1/models listed both, and a request
went to the server without its model (a 404 from there, and no log line)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient, AiohttpServer
from structlog.testing import capture_logs

from classifier.tokens import TokenCounter
from classifier.types import Route
from gateway.app import create_app
from gateway.extproc.pb import ext_proc_subset_pb2 as pb
from gateway.extproc.stream import Mode, PickerStream
from gateway.state import BACKENDS
from tests.gateway.conftest import make_config
from tests.gateway.fake_upstream import FakeUpstream
from tests.support import wait_until

Gateway = TestClient[web.Request, web.Application]


@pytest.fixture
def spec_upstream() -> FakeUpstream:
    return FakeUpstream("speculative", model="model-a")


@pytest.fixture
def base_upstream() -> FakeUpstream:
    return FakeUpstream("baseline", model="model-b")


async def _known(gateway: Gateway) -> None:
    """The prober has read every server's models."""
    pool = gateway.app[BACKENDS]
    await wait_until(
        lambda: all(u.models is not None for b in pool for u in b.upstreams),
        "every server's models read",
    )


def _chat(model: str, *, stream: bool = False) -> dict[str, Any]:
    return {"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}


async def test_ready_says_which_route_lacks_which_model(gateway: Gateway) -> None:
    await _known(gateway)
    r = await gateway.get("/ready")
    assert r.status == 503
    error = (await r.json())["error"]
    assert error["code"] == "not_ready"
    assert "route speculative serves ['model-a'], lacks ['model-b']" in error["message"]
    assert "route baseline serves ['model-b'], lacks ['model-a']" in error["message"]


async def test_ready_when_every_route_serves_the_model(
    gateway: Gateway, base_upstream: FakeUpstream
) -> None:
    base_upstream.model = "model-a"
    await _known(gateway)
    r = await gateway.get("/ready")
    assert r.status == 200
    assert (await r.json())["models"] == {"speculative": ["model-a"], "baseline": ["model-a"]}


async def test_models_names_the_routes_that_serve_each(gateway: Gateway) -> None:
    await _known(gateway)
    r = await gateway.get("/v1/models")
    assert r.status == 200
    body = await r.json()
    assert body["object"] == "list"
    cards = {card["id"]: card for card in body["data"]}
    assert cards["model-a"]["specroute_routes"] == ["speculative"]
    assert cards["model-b"]["specroute_routes"] == ["baseline"]
    assert cards["model-a"]["object"] == "model" and cards["model-a"]["owned_by"] == "vllm"


@pytest.mark.parametrize("policy", ["rules", "static-baseline"])
async def test_a_request_goes_only_to_the_route_that_serves_its_model(
    gateway_for: Any, spec_upstream: FakeUpstream, base_upstream: FakeUpstream, policy: str
) -> None:
    gateway = await gateway_for(routing={"policy": policy})
    await _known(gateway)
    with capture_logs() as logs:
        for stream in (False, True, False, True):
            r = await gateway.post("/v1/chat/completions", json=_chat("model-a", stream=stream))
            assert r.status == 200, await r.text()
            assert r.headers["x-specroute-route"] == "speculative"
            await r.read()
    assert len(spec_upstream.received) == 4
    assert base_upstream.received == []
    lacking = [e for e in logs if e["event"] == "route_lacks_model"]
    assert lacking == [  # once, not once a request
        {
            "event": "route_lacks_model",
            "log_level": "warning",
            "route": "baseline",
            "model": "model-a",
            "served": ["model-b"],
        }
    ]


async def test_a_model_no_route_serves_goes_on_unchanged_for_vllm_to_answer(
    gateway: Gateway, spec_upstream: FakeUpstream, base_upstream: FakeUpstream
) -> None:
    """vLLM's own 404 is what its clients expect, field by field (the real tier's SDK
    test compares them): the gateway does not answer for it."""
    await _known(gateway)
    r = await gateway.post("/v1/chat/completions", json=_chat("model-z"))
    await r.read()
    assert len(spec_upstream.received) + len(base_upstream.received) == 1


@dataclass
class BadModels(FakeUpstream):
    """Its /v1/models answers 200 with each of `answers` in turn."""

    answers: list[bytes] = field(default_factory=list)
    calls: int = 0

    async def _models(self, request: web.Request) -> web.Response:
        self.calls += 1
        body = self.answers[self.calls % len(self.answers)]
        return web.Response(body=body, content_type="application/json")


async def test_a_bad_models_answer_is_unknown_not_a_crash(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient, tokens: TokenCounter
) -> None:
    """Too deep for the parser, too long, not JSON, no list: the route's models are
    unknown, and unknown never refuses a request."""
    answers = [b"[" * 200_000, b"x" * (2 * 2**20), b"{not json", b'{"data": 7}']
    bad = BadModels("baseline", model="model-b", answers=answers)
    good = FakeUpstream("speculative", model="model-a")
    spec_server, base_server = await aiohttp_server(good.app()), await aiohttp_server(bad.app())
    config = make_config(str(spec_server.make_url("")), str(base_server.make_url("")))
    gateway = await aiohttp_client(create_app(config, tokens=tokens))
    await wait_until(lambda: bad.calls > len(answers), "every bad answer read")
    assert gateway.app[BACKENDS].of(Route.BASELINE).upstreams[0].models is None
    r = await gateway.get("/ready")
    assert r.status == 200
    assert (await r.json())["models"] == {"speculative": ["model-a"], "baseline": None}
    r = await gateway.post("/v1/chat/completions", json=_chat("model-b"))
    assert r.status == 200  # not known to lack it: the baseline takes it
    assert r.headers["x-specroute-route"] == "baseline"


def _headers(fields: dict[str, str]) -> pb.HttpHeaders:
    values = [pb.HeaderValue(key=k, raw_value=v.encode()) for k, v in fields.items()]
    return pb.HttpHeaders(headers=pb.HeaderMap(headers=values))


async def test_the_envoy_picker_routes_a_model_no_route_serves(
    aiohttp_client: AiohttpClient, config: Any, tokens: TokenCounter
) -> None:
    """As the gateway does: the request goes on, and vLLM answers its own 404."""
    client = await aiohttp_client(create_app(config, tokens=tokens, forward=False))
    await _known(client)
    stream = PickerStream(client.app, Mode.POOL)
    head = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
    await stream.on(pb.ProcessingRequest(request_headers=_headers(head)))
    body = pb.HttpBody(body=json.dumps(_chat("model-z")).encode(), end_of_stream=True)
    (reply,) = await stream.on(pb.ProcessingRequest(request_body=body))
    assert not reply.HasField("immediate_response")
