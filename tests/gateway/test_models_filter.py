"""Item 9 of issue 50 wherever a route is chosen, not only on the serve path: /decide,
the Envoy picker's choice and its gRPC health, and /ready, each read the routes' models
as a request does (gateway/backends/models.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp.plugin import AiohttpClient, AiohttpServer

from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.config import Config
from gateway.extproc.pb import ext_proc_subset_pb2 as pb
from gateway.extproc.server import Health
from gateway.extproc.stream import Mode, PickerStream
from gateway.request.dispatch import ROUTE_HEADER
from gateway.state import BACKENDS
from tests.gateway import test_models_served
from tests.gateway.conftest import make_config
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_models_served import _chat, _headers, _known
from tests.support import wait_until

Gateway = TestClient[web.Request, web.Application]
# Its servers, as test_models_served's: speculative serves model-a, baseline model-b.
spec_upstream = test_models_served.spec_upstream
base_upstream = test_models_served.base_upstream


async def test_decide_never_names_a_route_without_the_model(gateway_for: Any) -> None:
    """Before: /decide said baseline, where the request itself would go to speculative."""
    gateway = await gateway_for(routing={"policy": "static-baseline"})
    await _known(gateway)
    r = await gateway.post("/decide/v1/chat/completions", json=_chat("model-a"))
    assert r.status == 200, await r.text()
    body = await r.json()
    assert (body["route"], body["reason"]) == ("speculative", "model-fallback")
    assert body["backends"]["baseline"]["healthy"] is False
    r = await gateway.post("/v1/chat/completions", json=_chat("model-a"))
    assert r.headers["x-specroute-route"] == body["route"]  # the dry run is the request's


async def test_the_picker_never_fails_over_to_a_route_without_the_model(
    aiohttp_client: AiohttpClient, config: Config, tokens: TokenCounter, spec_upstream: FakeUpstream
) -> None:
    """The one route with the model is down: the serve path sends the request there
    anyway (vLLM or the failure answers), and so must the picker. Before: it failed over
    to the baseline, which answers 404 for model-a."""
    client = await aiohttp_client(create_app(config, tokens=tokens, forward=False))
    await _known(client)
    spec_upstream.healthy = False
    (spec,) = client.app[BACKENDS].of(next(iter(config.routes))).upstreams
    await wait_until(lambda: not spec.healthy, "the speculative server seen down")
    stream = PickerStream(client.app, Mode.POOL)
    head = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
    await stream.on(pb.ProcessingRequest(request_headers=_headers(head)))
    body = pb.HttpBody(body=json.dumps(_chat("model-a")).encode(), end_of_stream=True)
    (reply,) = await stream.on(pb.ProcessingRequest(request_body=body))
    mutation = reply.request_body.response.header_mutation
    routed = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
    assert routed[ROUTE_HEADER] == "speculative"


async def test_the_pickers_health_is_readys_when_no_model_is_common(
    aiohttp_client: AiohttpClient, config: Config, tokens: TokenCounter, base_upstream: FakeUpstream
) -> None:
    """Its gRPC health is /ready's answer (gateway/extproc/server.py says so): before, it
    said SERVING while /ready said 503, no model served by every route."""
    client = await aiohttp_client(create_app(config, tokens=tokens, forward=False))
    await _known(client)
    health = Health(client.app)
    assert (await client.get("/ready")).status == 503
    assert not health.serving()
    base_upstream.model = "model-a"
    pool = client.app[BACKENDS]
    await wait_until(lambda: all(served_a(u.models) for b in pool for u in b.upstreams), "model-a")
    assert (await client.get("/ready")).status == 200
    assert health.serving()


def served_a(models: dict[str, Any] | None) -> bool:
    return models is not None and "model-a" in models


@dataclass
class TwoModels(FakeUpstream):
    """Its /v1/models lists `model` and `also`."""

    also: str = "model-c"

    async def _models(self, request: web.Request) -> web.Response:
        cards = [{"id": m, "object": "model", "owned_by": "vllm"} for m in (self.model, self.also)]
        return web.json_response({"object": "list", "data": cards})


async def test_ready_names_what_a_route_lacks_beside_a_common_model(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient, tokens: TokenCounter
) -> None:
    """Ready (both serve model-a), and it says the baseline lacks model-c: before, only
    each route's list said so, for the reader to compare."""
    spec, base = TwoModels("speculative", model="model-a"), FakeUpstream("baseline", "model-a")
    spec_server, base_server = await aiohttp_server(spec.app()), await aiohttp_server(base.app())
    config = make_config(str(spec_server.make_url("")), str(base_server.make_url("")))
    gateway = await aiohttp_client(create_app(config, tokens=tokens))
    await _known(gateway)
    r = await gateway.get("/ready")
    assert r.status == 200
    body = await r.json()
    assert body["lacking"] == {"speculative": [], "baseline": ["model-c"]}
