"""The picker's reading of an SSE answer, message by message as Envoy sends it, without
Envoy: the gateway app (forward=False) over two fake upstreams, one PickerStream.

What the picker reads must not cost the square of the answer (an answer without a
blank line was re-scanned whole at every message), must read a normal stream as the
standalone gateway's readers read it, however Envoy cuts it, and must end an event
over the bound as the standalone gateway's relay ends it."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp.plugin import AiohttpClient, AiohttpServer

from classifier.tokens import TokenCounter
from gateway.app import create_app
from gateway.config import parse_config
from gateway.extproc import messages
from gateway.extproc.pb import ext_proc_subset_pb2 as pb
from gateway.extproc.stream import Mode, PickerStream
from gateway.state import BACKENDS
from gateway.wire.life import Meter, RequestLife
from gateway.wire.proxy import read_chat_events
from tests.gateway.fake_upstream import FakeUpstream

_FULL_DUPLEX = pb.ProcessingMode.FULL_DUPLEX_STREAMED
_HEAD = {"id": "c-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps({**_HEAD, **payload}).encode() + b"\n\n"


WORDS = ["Hello", " from", " the", " picker", "."]
USAGE = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
SPEC = {"num_drafts": 3, "num_draft_tokens": 6, "num_accepted_tokens": 4}
# vLLM's shape: the role chunk, one chunk a token, the usage chunk (with its per-request
# speculative metrics beside the usage), [DONE].
NORMAL = b"".join(
    [
        _event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        *(_event({"choices": [{"index": 0, "delta": {"content": w}}]}) for w in WORDS),
        _event({"choices": [], "usage": USAGE, "spec_decode": SPEC}),
        b"data: [DONE]\n\n",
    ]
)


PickerApp = Callable[..., Awaitable[web.Application]]


@pytest.fixture
def picker_app_for(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient, tokens: TokenCounter
) -> PickerApp:
    """make(**server section) -> the picker's app, started, over two fake upstreams."""

    async def make(**server: Any) -> web.Application:
        urls = {}
        for name in ("speculative", "baseline"):
            urls[name] = str((await aiohttp_server(FakeUpstream(name).app())).make_url(""))
        raw = {
            "backends": {name: {"urls": [url]} for name, url in urls.items()},
            "upstream": {"health_interval_s": 30.0, "scrape_interval_s": 30.0},
            "routing": {"policy": "rules"},
            "server": server,
        }
        client = await aiohttp_client(create_app(parse_config(raw), tokens=tokens, forward=False))
        return client.app

    return make


@pytest.fixture
async def picker_app(picker_app_for: PickerApp) -> web.Application:
    return await picker_app_for()


def _headers(fields: dict[str, str]) -> pb.HttpHeaders:
    values = [pb.HeaderValue(key=k, raw_value=v.encode()) for k, v in fields.items()]
    return pb.HttpHeaders(headers=pb.HeaderMap(headers=values))


async def _answering(
    app: web.Application, *, client_wants_usage: bool, duplex: bool
) -> tuple[PickerStream, RequestLife]:
    """A streamed chat request decided and its 200 SSE headers in: the answer's turn."""
    stream = PickerStream(app, Mode.POOL)
    first = pb.ProcessingRequest(
        request_headers=_headers(
            {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
        )
    )
    if duplex:
        first.protocol_config.CopyFrom(
            pb.ProtocolConfiguration(
                request_body_mode=_FULL_DUPLEX, response_body_mode=_FULL_DUPLEX
            )
        )
    await stream.on(first)
    body: dict[str, Any] = {
        "model": "m",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    if client_wants_usage:
        body["stream_options"] = {"include_usage": True}
    raw = json.dumps(body).encode()
    await stream.on(pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=True)))
    life = stream.life
    assert life is not None and life.route is not None
    status = {":status": "200", "content-type": "text/event-stream"}
    await stream.on(pb.ProcessingRequest(response_headers=_headers(status)))
    return stream, life


async def _feed(stream: PickerStream, pieces: list[bytes]) -> bytes:
    """Send the answer in these pieces; what Envoy sends the client."""
    out = bytearray()
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        message = pb.ProcessingRequest(response_body=pb.HttpBody(body=piece, end_of_stream=last))
        for reply in await stream.on(message):
            mutation = reply.response_body.response.body_mutation
            kind = mutation.WhichOneof("mutation")
            if kind is None:
                out += piece  # CONTINUE: the piece as it is
            elif kind == "body":
                out += mutation.body
            elif kind == "streamed_response":
                out += mutation.streamed_response.body
    return bytes(out)


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("client_wants_usage", [False, True])
@pytest.mark.parametrize("duplex", [False, True])
async def test_an_answer_without_a_blank_line_costs_its_length_not_its_square(
    picker_app: web.Application, client_wants_usage: bool, duplex: bool
) -> None:
    """8 MB in 4 KB messages took 14 s of the picker's CPU (the whole held answer
    re-scanned at every message); read once, it takes a fraction of a second. Under
    the default bound (16 MiB) nothing fails and nothing is cut."""
    stream, life = await _answering(
        picker_app, client_wants_usage=client_wants_usage, duplex=duplex
    )
    big = b"data: " + b"x" * (8 * 1024 * 1024)
    started = time.process_time()
    out = await _feed(stream, _pieces(big, 4096))
    spent = time.process_time() - started
    assert spent < 2.0, f"{spent:.1f} s of CPU for one 8 MB answer"
    assert out == big  # the unended event passes at the end, as before
    assert life.meter.error_kind is None
    assert life.meter.bytes_sent == len(big)
    assert stream.life is None  # settled


def _reference(client_wants_usage: bool) -> tuple[Meter, bytes]:
    """What the standalone gateway's reader makes of the whole stream at once."""
    meter = Meter(started=time.perf_counter())
    out = read_chat_events(NORMAL, meter, not client_wants_usage)
    return meter, out


@pytest.mark.parametrize("size", [1, 7, 100, 4096])
@pytest.mark.parametrize("client_wants_usage", [False, True])
@pytest.mark.parametrize("duplex", [False, True])
async def test_a_normal_stream_reads_the_same_however_envoy_cuts_it(
    picker_app: web.Application, size: int, client_wants_usage: bool, duplex: bool
) -> None:
    stream, life = await _answering(
        picker_app, client_wants_usage=client_wants_usage, duplex=duplex
    )
    out = await _feed(stream, _pieces(NORMAL, size))
    expected_meter, expected_out = _reference(client_wants_usage)
    meter = life.meter
    assert out == expected_out
    assert meter.usage == USAGE
    assert meter.report is not None and meter.report["spec_decode"] == SPEC
    assert meter.ttft_s is not None
    assert (meter.events, meter.events_before_token, meter.closing_events) == (
        expected_meter.events,
        expected_meter.events_before_token,
        expected_meter.closing_events,
    )
    assert meter.error_kind is None and meter.ended
    assert meter.bytes_sent == len(out)
    assert stream.life is None  # settled


async def test_a_crlf_framed_stream_is_read_too(picker_app: web.Application) -> None:
    """SSE allows CRLF: the events are read (the old cut looked for LF LF only)."""
    stream, life = await _answering(picker_app, client_wants_usage=False, duplex=False)
    out = await _feed(stream, _pieces(NORMAL.replace(b"\n", b"\r\n"), 50))
    assert out == _reference(client_wants_usage=False)[1]
    assert life.meter.usage == USAGE


@pytest.mark.parametrize("client_wants_usage", [False, True])
async def test_an_event_over_the_bound_ends_the_stream_as_the_relay_ends_it(
    picker_app_for: PickerApp, client_wants_usage: bool
) -> None:
    """The backend failed (upstream_malformed, counted against it), the client gets the
    events before, an error event and [DONE], and nothing the backend sends after."""
    app = await picker_app_for(max_body_bytes=64 * 1024)  # events bound at 256 KiB
    stream, life = await _answering(app, client_wants_usage=client_wants_usage, duplex=False)
    route = life.route
    assert route is not None
    first = NORMAL.split(b"\n\n", 2)
    head = first[0] + b"\n\n" + first[1] + b"\n\n"
    too_long = b"data: " + b"y" * (300 * 1024)
    after = b"\n\n" + NORMAL  # the rest: dropped
    out = await _feed(stream, [head, *_pieces(too_long, 4096), *_pieces(after, 4096)])
    assert life.meter.error_kind == "upstream_malformed"
    assert out.startswith(head)
    tail = out.rsplit(b"\n\n", 3)
    error = json.loads(tail[-3].removeprefix(b"data: "))["error"]
    assert error["code"] == "upstream_malformed"
    assert error["message"].startswith(f"backend stream interrupted: backend {route.value} sent")
    assert out.endswith(b"data: [DONE]\n\n")
    assert b"Hello" not in out[len(head) :]  # nothing after the error event
    if not client_wants_usage:
        assert b"yyyy" not in out  # the event never reached the client
    upstreams = app[BACKENDS].of(route).upstreams
    assert upstreams[0].consecutive_failures == 1


def test_a_chunk_that_passes_builds_no_reply() -> None:
    """The picker's loop does no per-chunk work beyond cutting events (issue 53): a chunk it
    lets pass is answered with the one CONTINUE built at import, the same bytes a new one
    would serialise to."""
    first, second = messages.response_body_reply(), messages.response_body_reply()
    assert first is second
    fresh = pb.ProcessingResponse(response_body=pb.BodyResponse(response=pb.CommonResponse()))
    assert first.SerializeToString() == fresh.SerializeToString()
    changed = messages.response_body_reply(messages.common(body=b"x"))
    assert changed is not first and changed.response_body.response.body_mutation.body == b"x"
    assert first.SerializeToString() == fresh.SerializeToString()  # untouched by that
