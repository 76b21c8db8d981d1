"""Never fail a request the other backend could serve (issue: hostile probe of main).

Each test here failed before its fix: a refused connection did not readmit
an ejected backend, explicit routes and the retry budget ignored a dead
backend, 502s named the backend's address, compressed answers lost their
Content-Encoding, and the client's raw X-Request-Id reached the backend.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from classifier.tokens import TokenCounter
from classifier.types import Route
from gateway.app import create_app
from gateway.state import BACKENDS
from tests.gateway.conftest import ClientFactory, ServerFactory, make_config
from tests.gateway.fake_upstream import FakeUpstream, backend_app
from tests.gateway.test_routing import chat

Client = TestClient[web.Request, web.Application]
STRUCTURED = chat("JSON please", temperature=0, response_format={"type": "json_object"})


async def _gateway(
    aiohttp_client: ClientFactory, spec: str, base: str, tokens: TokenCounter, **sections: object
) -> Client:
    config = make_config(spec, base, **sections)  # type: ignore[arg-type]
    return await aiohttp_client(create_app(config, tokens=tokens))


async def test_refused_connection_readmits_the_ejected_backend(
    aiohttp_client: ClientFactory,
    unused_tcp_port: int,
    base_server: TestServer,
    tokens: TokenCounter,
) -> None:
    """Baseline ejected by stalls, then the speculative server dies: nothing may 502."""
    client = await _gateway(
        aiohttp_client,
        f"http://127.0.0.1:{unused_tcp_port}",
        str(base_server.make_url("")),
        tokens,
        upstream={"eject_after_failures": 3, "eject_s": 60.0, "health_interval_s": 60.0},
    )
    pool = client.app[BACKENDS]
    baseline = pool.of(Route.BASELINE)
    for _ in range(3):
        pool.report_failure(baseline, baseline.upstreams[0], "upstream_stall")
    assert not baseline.healthy and baseline.reachable

    statuses = [
        (await client.post("/v1/chat/completions", json=STRUCTURED)).status for _ in range(10)
    ]
    assert statuses == [200] * 10
    assert baseline.healthy  # readmitted at the first refusal, not at the next probe
    assert not pool.of(Route.SPECULATIVE).healthy


async def test_override_and_static_routes_to_a_dead_backend_go_to_the_other(
    aiohttp_client: ClientFactory,
    unused_tcp_port: int,
    base_server: TestServer,
    tokens: TokenCounter,
) -> None:
    """With no retry budget at all, a dead backend still costs no request."""
    no_budget = {"retry_budget_ratio": 0.0, "retry_budget_min": 0}
    for policy in ("rules", "static-speculative"):
        client = await _gateway(
            aiohttp_client,
            f"http://127.0.0.1:{unused_tcp_port}",
            str(base_server.make_url("")),
            tokens,
            upstream=no_budget,
            routing={"policy": policy},
        )
        forced = {"x-specroute-route": "speculative"}
        responses = await asyncio.gather(
            *(
                client.post("/v1/chat/completions", json=STRUCTURED, headers=forced)
                for _ in range(40)
            )
        )
        assert [r.status for r in responses] == [200] * 40, policy
        assert {r.headers["x-specroute-route"] for r in responses} == {"baseline"}
        assert {r.headers["x-specroute-failover"] for r in responses} == {"speculative"}


async def test_a_502_names_the_route_and_a_reason_but_never_the_address(
    aiohttp_client: ClientFactory, unused_tcp_port_factory: object, tokens: TokenCounter
) -> None:
    spec_port, base_port = unused_tcp_port_factory(), unused_tcp_port_factory()  # type: ignore[operator]
    client = await _gateway(
        aiohttp_client,
        f"http://127.0.0.1:{spec_port}",
        f"http://127.0.0.1:{base_port}",
        tokens,
    )
    with capture_logs() as logs:
        resp = await client.post("/v1/chat/completions", json=STRUCTURED)
        body = await resp.text()
    assert resp.status == 502
    message = json.loads(body)["error"]["message"]
    assert "speculative" in message or "baseline" in message
    assert "refused" in message
    assert "127.0.0.1" not in body and str(spec_port) not in body and str(base_port) not in body
    urls = {e.get("url") for e in logs if e["event"] == "upstream_unreachable"}
    assert f"http://127.0.0.1:{spec_port}" in urls  # the address goes to the log only


def _always_gzip() -> web.Application:
    """A backend (or a proxy in front of one) that compresses whatever it was asked."""

    async def generate(request: web.Request) -> web.Response:
        body = {"id": "g", "object": "chat.completion", "model": "m", "choices": []}
        return web.Response(
            body=gzip.compress(json.dumps(body).encode()),
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )

    return backend_app(generate)


async def test_answers_are_asked_for_plain_and_passed_on_with_their_encoding(
    aiohttp_client: ClientFactory,
    aiohttp_server: ServerFactory,
    base_server: TestServer,
    base_upstream: FakeUpstream,
    tokens: TokenCounter,
) -> None:
    compressing = await aiohttp_server(_always_gzip())
    client = await _gateway(
        aiohttp_client, str(compressing.make_url("")), str(base_server.make_url("")), tokens
    )
    gz = {"Accept-Encoding": "gzip"}
    plain = await client.post(
        "/v1/chat/completions", json=chat("hi"), headers={**gz, "x-specroute-route": "baseline"}
    )
    assert plain.status == 200 and (await plain.json())["choices"]
    assert base_upstream.headers_seen[-1]["Accept-Encoding"] == "identity"

    packed = await client.post(
        "/v1/chat/completions", json=chat("hi"), headers={**gz, "x-specroute-route": "speculative"}
    )
    assert packed.headers.get("Content-Encoding") == "gzip"
    assert (await packed.json())["id"] == "g"  # the client could decode it


async def test_the_backend_gets_exactly_the_request_id_the_gateway_logs_and_returns(
    gateway: Client, base_upstream: FakeUpstream, spec_upstream: FakeUpstream
) -> None:
    hostile = 'a b"}{"injected":1'
    for given in (hostile, "x" * 8000, "trace-42.a:b"):
        with capture_logs(processors=[merge_contextvars]) as logs:
            resp = await gateway.post(
                "/v1/chat/completions", json=STRUCTURED, headers={"X-Request-Id": given}
            )
        assert resp.status == 200
        returned = resp.headers["X-Request-Id"]
        seen = {k.lower(): v for k, v in spec_upstream.headers_seen[-1].items()}
        forwarded = seen["x-request-id"]
        (line,) = [e for e in logs if e["event"] == "request"]
        assert forwarded == returned == line["request_id"]
        assert (returned == given) is (given == "trace-42.a:b")


async def test_ready_answers_from_the_probers_results(
    gateway: Client, spec_upstream: FakeUpstream, base_upstream: FakeUpstream
) -> None:
    """1,000 readiness calls must not become 2,000 backend /health calls."""
    assert (await gateway.get("/ready")).status == 200
    before = spec_upstream.health_calls + base_upstream.health_calls
    for _ in range(200):
        assert (await gateway.get("/ready")).status == 200
    # the prober runs every 0.2 s in these tests: a few rounds at most
    assert spec_upstream.health_calls + base_upstream.health_calls - before < 20


async def test_n_is_capped_at_openais_limit(gateway: Client, spec_upstream: FakeUpstream) -> None:
    too_many = await gateway.post("/v1/chat/completions", json={**STRUCTURED, "n": 129})
    assert too_many.status == 400
    assert (await too_many.json())["error"]["param"] == "n"
    assert not spec_upstream.received
    assert (await gateway.post("/v1/chat/completions", json={**STRUCTURED, "n": 2})).status == 200


def _drops_before_answering(times: int | None) -> web.Application:
    """A backend that dies under a request: the connection drops before any answer
    (the first `times` requests; None: all), then it answers."""
    seen = [0]

    async def generate(request: web.Request) -> web.StreamResponse:
        await request.read()
        seen[0] += 1
        if times is None or seen[0] <= times:
            assert request.transport is not None
            request.transport.close()
            raise web.HTTPInternalServerError()  # never sent: the connection is gone
        body = {"id": "late", "object": "chat.completion", "model": "m", "choices": []}
        return web.json_response(body)

    return backend_app(generate)


async def test_answers_in_flight_when_their_backend_dies_go_to_the_other(
    aiohttp_client: ClientFactory,
    aiohttp_server: ServerFactory,
    base_server: TestServer,
    tokens: TokenCounter,
) -> None:
    """Before: "server disconnected" needed a retry-budget slot, and 16 of 20 got 502."""
    dying = await aiohttp_server(_drops_before_answering(None))
    client = await _gateway(
        aiohttp_client,
        str(dying.make_url("")),
        str(base_server.make_url("")),
        tokens,
        upstream={"retry_budget_ratio": 0.0, "retry_budget_min": 0},
    )
    responses = await asyncio.gather(
        *(client.post("/v1/chat/completions", json=STRUCTURED) for _ in range(20))
    )
    assert [r.status for r in responses] == [200] * 20
    assert {r.headers["x-specroute-route"] for r in responses} == {"baseline"}


async def test_a_request_whose_stand_in_dies_too_goes_back_to_the_first(
    aiohttp_client: ClientFactory, aiohttp_server: ServerFactory, tokens: TokenCounter
) -> None:
    """The speculative server drops one request (restarting), the baseline dies under it
    too: the third attempt finds the speculative server back. Before: 502."""
    spec = await aiohttp_server(_drops_before_answering(1))
    base = await aiohttp_server(_drops_before_answering(None))
    client = await _gateway(aiohttp_client, str(spec.make_url("")), str(base.make_url("")), tokens)
    resp = await client.post("/v1/chat/completions", json=STRUCTURED)
    assert resp.status == 200 and (await resp.json())["id"] == "late"
    assert resp.headers["x-specroute-route"] == "speculative"


async def test_a_large_body_is_forwarded_whole(
    aiohttp_client: ClientFactory, aiohttp_server: ServerFactory, tokens: TokenCounter
) -> None:
    """Bodies over 1 MiB went out as raw bytes: aiohttp's ResourceWarning became a 500."""
    sizes: list[int] = []

    async def generate(request: web.Request) -> web.Response:
        sizes.append(len(await request.read()))
        return web.json_response({"id": "big", "object": "chat.completion", "choices": []})

    backend = await aiohttp_server(backend_app(generate, client_max_size=8 * 1024**2))
    url = str(backend.make_url(""))
    client = await _gateway(aiohttp_client, url, url, tokens)
    text = " ".join(f"word{i}" for i in range(300_000))  # ~2.3 MB
    payload = json.dumps(chat(text)).encode()
    headers = {"Content-Type": "application/json"}
    resp = await client.post("/v1/chat/completions", data=io.BytesIO(payload), headers=headers)
    assert resp.status == 200, await resp.text()
    assert sizes == [len(payload)]
