"""The Responses API's own parts: its streamed events, and where its stored responses live.

`/v1/responses` is routed like chat (pipeline.py); what differs is the wire.
Its stream is named SSE events (`event: response.output_text.delta`), with no
usage chunk to ask for and no `[DONE]`: the usage comes in `response.completed`.

A stored response lives on the server that made it (vLLM keeps it in that
process's memory, with VLLM_ENABLE_RESPONSES_API_STORE=1). So a request that
names one (previous_response_id, GET /v1/responses/{id}, .../cancel) must go
there, whatever the router would prefer: the gateway remembers each answer's id
(a whole answer's, or the response object of a stream's events) and its server
in a bounded map, and asks every server for an id it does not know (one made
before a restart, or by a stream still running).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, NamedTuple
from urllib.parse import quote

import aiohttp
from aiohttp import web

from classifier.types import Route
from gateway.backends.pool import Backend, Upstream
from gateway.state import BACKENDS, RUNTIME, SESSION
from gateway.wire.life import UPSTREAM_ERROR_EVENT, Meter
from gateway.wire.proxy import loads_object, usage_in

# The ids remembered. A setting's job, but config.py is not this module's to grow:
# 100k entries (~20 MB) outlive any response a vLLM process keeps in memory.
OWNERS_MAX = 100_000

_EVENT_END = b"\n\n"
_DATA = b"\ndata: "
# Events that carry the whole response object (its id, at the end its usage).
_WHOLE = (b"response.created", b"response.completed", b"response.incomplete", b"response.failed")
_FAILED = (b"error", b"response.failed")
_LAST = (b"response.completed", b"response.incomplete", *_FAILED)  # a stream's last events


class Owner(NamedTuple):
    route: Route
    upstream: Upstream


class ResponseOwners:
    """Response id -> the server that stored it, for the newest OWNERS_MAX ids."""

    def __init__(self, limit: int = OWNERS_MAX) -> None:
        self._limit = limit
        self._owners: OrderedDict[str, Owner] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owners)

    def remember(self, response_id: str, owner: Owner) -> None:
        self._owners[response_id] = owner
        self._owners.move_to_end(response_id)
        while len(self._owners) > self._limit:
            self._owners.popitem(last=False)

    def get(self, response_id: str) -> Owner | None:
        owner = self._owners.get(response_id)
        if owner is not None:
            self._owners.move_to_end(response_id)
        return owner


RESPONSE_OWNERS = web.AppKey("response_owners", ResponseOwners)


def read_events(chunk: bytes, meter: Meter, strip_usage_chunk: bool) -> bytes:
    """Responses events: the first token (the first non-empty delta), the response
    object (its id, then its usage) and errors; every event is relayed.

    An event that carries no token counts before the first token or among the
    closing ones, so that meter.token_events counts the deltas, one per engine step,
    as a chat stream's chunks do. The stream has ended when its last event is one
    that ends a response (vLLM sends no [DONE] here; one would do too).
    """
    for event in chunk.split(_EVENT_END)[:-1]:
        meter.events += 1
        name = _name(event)
        meter.ended = name in _LAST or event.startswith(b"data: [DONE]")
        delta = name.endswith(b".delta")
        if delta and meter.ttft_s is None and _has_text(event):
            meter.first_token()
        elif meter.ttft_s is None:
            meter.events_before_token += 1
        elif not delta:
            meter.closing_events += 1
        if name in _WHOLE and (parsed := _data(event)) is not None:
            response = parsed.get("response")
            if isinstance(response, dict):
                meter.report = response
                meter.usage = usage_in(response) or meter.usage
        if name in _FAILED and meter.error_kind is None:
            meter.fail(UPSTREAM_ERROR_EVENT)
    return chunk


def _name(event: bytes) -> bytes:
    if not event.startswith(b"event: "):
        return b""
    end = event.find(b"\n")
    return event[7 : end if end >= 0 else len(event)].strip()


def _data(event: bytes) -> dict[str, Any] | None:
    start = event.find(_DATA)
    return loads_object(event[start + len(_DATA) :]) if start >= 0 else None


def _has_text(event: bytes) -> bool:
    parsed = _data(event)
    return parsed is not None and bool(parsed.get("delta"))


def response_id(report: dict[str, Any] | None) -> str | None:
    """A response object's id. Whether the server kept it, vLLM 0.32's answer does
    not say (it has no `store` field): every id is remembered, and one it did not
    keep gets its maker's 404, as it would get anywhere."""
    if not report or report.get("object") != "response":
        return None
    found = report.get("id")
    return found if isinstance(found, str) and found else None


def remember(app: web.Application, report: dict[str, Any] | None, upstream: Upstream) -> None:
    """Note the server that made this response."""
    made = response_id(report)
    if made is None:
        return
    for backend in app[BACKENDS]:
        if upstream in backend.upstreams:
            app[RESPONSE_OWNERS].remember(made, Owner(backend.route, upstream))


async def owner_of(app: web.Application, response_id: str) -> Owner | None:
    """The server that stored `response_id`: remembered, else the first to say it has
    it (every endpoint is asked at once), else None."""
    owners = app[RESPONSE_OWNERS]
    if (owner := owners.get(response_id)) is not None:
        return owner
    pool = app[BACKENDS]
    candidates = [(b, u) for b in pool for u in b.upstreams]
    timeout_s = app[RUNTIME].current.config.upstream.health_timeout_s
    found = await asyncio.gather(
        *(_has(app[SESSION], b, u, response_id, timeout_s) for b, u in candidates)
    )
    for (backend, upstream), has in zip(candidates, found, strict=True):
        if has:
            owner = Owner(backend.route, upstream)
            owners.remember(response_id, owner)
            return owner
    return None


async def _has(
    session: aiohttp.ClientSession,
    backend: Backend,
    upstream: Upstream,
    response_id: str,
    timeout_s: float,
) -> bool:
    url = f"{upstream.url}/v1/responses/{quote(response_id, safe='')}"
    try:
        async with session.get(
            url, headers=backend.headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False
