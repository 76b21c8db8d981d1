"""A real HTTP server for the rest of vLLM's API: the Responses API and a few of
the paths the gateway passes through, in vLLM 0.32's shapes.

The Responses events are named SSE events (`event: response.created` ...), the
usage comes in `response.completed` as input_tokens/output_tokens, and a stored
response is kept in this server's memory only, as vLLM keeps it
(VLLM_ENABLE_RESPONSES_API_STORE=1). Everything it saw is recorded.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

WORDS = ["Hello", " from", " responses", "."]


async def _empty(request: web.Request) -> web.Response:
    return web.Response()


@dataclass
class FakeVllmRest:
    name: str
    store: bool = True  # VLLM_ENABLE_RESPONSES_API_STORE
    chunk_delay_s: float = 0.0
    stored: dict[str, dict[str, Any]] = field(default_factory=dict)
    seen: list[tuple[str, str]] = field(default_factory=list)  # (method, path_qs)
    bodies: list[bytes] = field(default_factory=list)
    headers_seen: list[dict[str, str]] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/health", _empty)
        app.router.add_post("/v1/responses", self._create)
        app.router.add_get("/v1/responses/{id}", self._retrieve)
        app.router.add_post("/v1/responses/{id}/cancel", self._cancel)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/version", self._version)
        app.router.add_post("/v1/audio/transcriptions", self._slow_stream)
        app.router.add_post("/sleep", _empty)  # were it forwarded, it would say 200
        return app

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        # the gateway's probes (/health, and /v1/models with each) and scrapes
        if request.path not in ("/health", "/metrics", "/v1/models"):
            self.seen.append((request.method, request.path_qs))
            self.bodies.append(await request.read())
            self.headers_seen.append(dict(request.headers))
        response: web.StreamResponse = await handler(request)
        return response

    def _not_found(self, response_id: str) -> web.Response:
        error = {
            "message": f"Response with id '{response_id}' not found.",
            "type": "invalid_request_error",
            "param": "response_id",
            "code": 404,
        }
        return web.json_response({"error": error}, status=404)

    async def _create(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self.stored:
            return self._not_found(previous)
        words = WORDS[: body.get("max_output_tokens") or len(WORDS)]
        response_id = f"resp_{self.name}_{next(self._ids)}"
        keep = self.store and body.get("store", True)
        response: dict[str, Any] = {
            "id": response_id,
            "object": "response",
            "created_at": 1,
            "model": "fake-model",
            "status": "in_progress",  # no `store` field: vLLM 0.32's answers have none
            "previous_response_id": previous,
            "output": [],
            "usage": None,
        }
        done = {
            **response,
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "".join(words)}],
                }
            ],
            "usage": {
                "input_tokens": 5,
                "output_tokens": len(words),
                "total_tokens": 5 + len(words),
            },
        }
        if keep:
            self.stored[response_id] = done
        if not body.get("stream"):
            return web.json_response(done)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.created", {"response": response}),
            ("response.in_progress", {"response": response}),
            ("response.output_item.added", {"output_index": 0, "item": {"type": "message"}}),
        ]
        events += [("response.output_text.delta", {"delta": w}) for w in words]
        events += [
            ("response.output_text.done", {"text": "".join(words)}),
            ("response.completed", {"response": done}),
        ]
        for n, (kind, data) in enumerate(events):
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
            payload = json.dumps({"type": kind, "sequence_number": n, **data})
            await stream.write(f"event: {kind}\ndata: {payload}\n\n".encode())
        await stream.write_eof()
        return stream

    async def _retrieve(self, request: web.Request) -> web.Response:
        response_id = request.match_info["id"]
        if response_id not in self.stored:
            return self._not_found(response_id)
        return web.json_response(self.stored[response_id])

    async def _cancel(self, request: web.Request) -> web.Response:
        response_id = request.match_info["id"]
        if response_id not in self.stored:
            return self._not_found(response_id)
        return web.json_response({**self.stored[response_id], "status": "cancelled"})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        tokens = list(range(len(str(body.get("prompt", "")).split())))
        return web.json_response(
            {"count": len(tokens), "tokens": tokens, "server": self.name},
            headers={"X-Backend-Header": self.name, "Keep-Alive": "timeout=5"},
        )

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})

    async def _slow_stream(self, request: web.Request) -> web.StreamResponse:
        """A long streamed answer, to see a client's disconnect reach the backend."""
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        try:
            for n in range(100):
                await stream.write(f"data: {n}\n\n".encode())
                await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        await stream.write_eof()
        return stream
