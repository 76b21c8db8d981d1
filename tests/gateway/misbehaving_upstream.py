"""A backend that breaks HTTP and SSE the ways a sick server or a bad proxy does.

aiohttp's own server would refuse to send most of this, so it is a raw asyncio
server on 127.0.0.1. `/health`, `/metrics` and `/v1/models` always answer 200, as a
wedged vLLM's do: only the traffic shows the fault. `/metrics` answers `metrics` (empty:
no figures) or a body without end, `/v1/models` answers `models`. Every other request
(generation or passthrough) is answered by the current `Behaviour`. Each
connection serves one request and closes, so the gateway's pool never hands a test a
connection left from another.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import re
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_STREAM = re.compile(rb'"stream"\s*:\s*true')

# JSON members a client may send that the gateway must pass on as sent and never
# write back itself: about 1,010 levels deep in a body of 64 KB or more (orjson takes
# 1,024; json.dumps recursed out), and a number no float holds (json.dumps wrote
# Infinity, which is no JSON and vLLM's parser refuses). For pytest.mark.parametrize.
UNWRITABLE_MEMBERS = (
    b'"deep":' + b"[" * 1010 + b"]" * 1010 + b',"pad":"' + b"x" * 70_000 + b'"',
    b'"repetition_penalty":1e309',
)
UNWRITABLE_IDS = ("deeply_nested", "huge_number")
WORDS = ("Hello", " from", " a", " raw", " server", ".")


class Behaviour(enum.Enum):
    OK = "ok"  # a good answer: a JSON object, or an SSE stream that ends with [DONE]
    SILENCE = "silence"  # the request is read and nothing is ever sent (a wedged engine)
    HEADERS_THEN_SILENCE = "headers_then_silence"  # a 200's headers, then nothing
    DRIP = "drip"  # a 200's headers, then one byte every drip_s of a body never finished
    LONG_HEADER = "long_header"  # a 100 KB header line
    NOT_HTTP = "not_http"  # bytes that are no HTTP at all
    BAD_STATUS = "bad_status"  # a status line with no status code
    CRLF_SSE = "crlf_sse"  # a good stream framed with CRLF, as SSE allows
    NO_BLANK_LINES = "no_blank_lines"  # data lines and never a blank line: no event ends
    NO_DONE = "no_done"  # good events, then a clean end of the body without [DONE]
    RESET_MID_BODY = "reset_mid_body"  # part of the body, then a TCP reset


# What no HTTP parser takes: the gateway never gets a status to look at.
_UNPARSABLE = {
    Behaviour.LONG_HEADER: b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 100_000 + b"\r\n\r\n",
    Behaviour.NOT_HTTP: b"\x00\x01\x02 this is not HTTP \xff\xfe\r\n\r\n",
    Behaviour.BAD_STATUS: b"HTTP/1.1 abc OK\r\nContent-Length: 0\r\n\r\n",
}
MALFORMED = tuple(_UNPARSABLE)

# What a server's GET /v1/models answers (the model the tests ask for), and a hostile
# one's: valid JSON 100,000 levels deep (json.loads raises RecursionError, no ValueError).
MODELS = b'{"object": "list", "data": [{"id": "fake-model", "object": "model"}]}'
DEEP_MODELS = b'{"object": "list", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
_ENDLESS_METRICS = b'vllm:num_requests_running{engine="0"} 1\n' * 1024


@dataclass(frozen=True, slots=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class MisbehavingUpstream:
    name: str
    behaviour: Behaviour = Behaviour.OK
    drip_s: float = 0.02
    metrics: bytes = b""  # what /metrics answers
    endless_metrics: bool = False  # /metrics sends good lines until the gateway hangs up
    metrics_sent: int = 0  # bytes of /metrics bodies sent
    models: bytes = MODELS  # what GET /v1/models answers
    received: list[Received] = field(default_factory=list)  # all but those three
    _server: asyncio.Server | None = None
    _closing: asyncio.Event = field(default_factory=asyncio.Event)  # what "for ever" waits on
    _serving: set[asyncio.Task[Any]] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def close(self) -> None:
        """Stop serving; the answers still running end (a cancelled one would be logged)."""
        assert self._server is not None
        self._closing.set()
        self._server.close()
        await asyncio.gather(*self._serving)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        try:
            request = await _read_request(reader)
            if request is None:
                return
            if request.path == "/health":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            elif request.path == "/metrics":
                await self._metrics(writer)
            elif request.path == "/v1/models" and request.method == "GET":
                length = f"Content-Length: {len(self.models)}"
                writer.write(_head("application/json", length) + self.models)
            else:
                self.received.append(request)
                await self._answer(writer, bool(_STREAM.search(request.body)))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._serving.discard(task)
            writer.close()

    async def _metrics(self, writer: asyncio.StreamWriter) -> None:
        content_type = "text/plain; version=0.0.4; charset=utf-8"
        if not self.endless_metrics:
            writer.write(_head(content_type, f"Content-Length: {len(self.metrics)}") + self.metrics)
            self.metrics_sent += len(self.metrics)
            return
        writer.write(_head(content_type, "Transfer-Encoding: chunked"))
        piece = _chunk(_ENDLESS_METRICS)
        while not self._closing.is_set():  # until the gateway gives up and hangs up
            writer.write(piece)
            self.metrics_sent += len(_ENDLESS_METRICS)
            await writer.drain()

    async def _answer(self, writer: asyncio.StreamWriter, stream: bool) -> None:
        b = self.behaviour
        if b in _UNPARSABLE:
            writer.write(_UNPARSABLE[b])
            return
        if b is Behaviour.SILENCE:
            await self._closing.wait()
            return
        if stream:
            head = _head("text/event-stream", "Transfer-Encoding: chunked")
            frame: Callable[[bytes], bytes] = _chunk
            pieces = events(self.name, framing=b"\r\n" if b is Behaviour.CRLF_SSE else b"\n")
            if b is Behaviour.NO_DONE:
                pieces = pieces[:-1]
            end = b"0\r\n\r\n"  # the chunked body's clean end
        else:
            body = json.dumps(_completion(self.name)).encode()
            head = _head("application/json", f"Content-Length: {len(body)}")
            pieces, end = [body], b""
            frame = bytes
        if b is Behaviour.HEADERS_THEN_SILENCE:
            writer.write(head)
            await writer.drain()
            await self._closing.wait()
        elif b is Behaviour.DRIP:
            writer.write(head)
            unfinished = b'data: {"never": "' + b"." * 500 if stream else pieces[0]
            for i in range(len(unfinished)):  # one byte at a time, well within the read timeout
                if self._closing.is_set():
                    return
                writer.write(frame(unfinished[i : i + 1]))
                await writer.drain()
                await asyncio.sleep(self.drip_s)
            await self._closing.wait()
        elif b is Behaviour.RESET_MID_BODY:
            # A stream: its first event whole and part of the next; an answer: half of it.
            part = pieces[0] + pieces[1][:20] if stream else pieces[0][: len(pieces[0]) // 2]
            await _reset_after(writer, head + frame(part))
        elif b is Behaviour.NO_BLANK_LINES and stream:
            writer.write(head)
            lines = b'data: {"choices": []}\n' * 4096
            while not self._closing.is_set():  # until the gateway gives up and hangs up
                writer.write(frame(lines))
                await writer.drain()
        else:
            writer.write(head + b"".join(frame(p) for p in pieces) + end)


def events(name: str, *, framing: bytes = b"\n") -> list[bytes]:
    """A chat stream as vLLM sends it: role, one event per word, usage, [DONE]."""
    head = {"id": f"{name}-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"content": w} for w in WORDS]
    payloads = [{**head, "choices": [{"index": 0, "delta": d}]} for d in deltas]
    usage = {"prompt_tokens": 3, "completion_tokens": len(WORDS), "total_tokens": 3 + len(WORDS)}
    payloads.append({**head, "choices": [], "usage": usage})
    end = framing * 2
    return [b"data: " + json.dumps(p).encode() + end for p in payloads] + [b"data: [DONE]" + end]


def _completion(name: str) -> dict[str, Any]:
    usage = {"prompt_tokens": 3, "completion_tokens": len(WORDS), "total_tokens": 3 + len(WORDS)}
    message = {"role": "assistant", "content": "".join(WORDS)}
    return {
        "id": f"{name}-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": usage,
    }


def _head(content_type: str, framing: str) -> bytes:
    return (
        f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n{framing}\r\nConnection: close\r\n\r\n"
    ).encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _reset_after(writer: asyncio.StreamWriter, sent: bytes) -> None:
    """Send `sent`, then reset the connection (SO_LINGER 0: an RST, not a FIN)."""
    writer.write(sent)
    await writer.drain()
    await asyncio.sleep(0.05)  # let the bytes reach the gateway before the reset
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _read_request(reader: asyncio.StreamReader) -> Received | None:
    with contextlib.suppress(asyncio.IncompleteReadError):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        size = int({k.lower(): v for k, v in headers.items()}.get("content-length", 0))
        body = await reader.readexactly(size)
        return Received(method, path, headers, body)
    return None
