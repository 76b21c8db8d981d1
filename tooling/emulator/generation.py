"""POST /v1/chat/completions and /v1/completions: a request through the engine.

The path of one request: parse (protocol.py), claim this request's faults
(faults.py), plan its answer and its acceptance (textgen.py, acceptance.py),
submit it to the engine, then relay the engine's outputs: one SSE chunk per
engine step when streaming, one body at the end otherwise. Whatever ends the
handler (the answer finished, the client disconnected and aiohttp cancelled the
handler, a write failed, an injected drop), the `finally` aborts the request in
the engine, which is a no-op for a finished one: a client that goes away stops
its generation, as vLLM does.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from . import bodies, protocol
from .acceptance import classify, request_acceptance
from .config import EmulatorConfig
from .engine import Engine, Sequence, StepOutput
from .faults import FaultPlan, Faults, drop_connection
from .metrics import VllmMetrics
from .protocol import ApiError, Endpoint, GenerationRequest
from .textgen import plan_answer

ACCEPTANCE_HEADER = "X-Emulator-Acceptance"  # tests may pin a request's acceptance


@dataclass
class EmulatorState:
    """Everything one emulated server holds; stored under the EMULATOR app key."""

    config: EmulatorConfig
    metrics: VllmMetrics
    engine: Engine
    faults: Faults
    arrivals: itertools.count[int] = field(default_factory=itertools.count)


EMULATOR = web.AppKey("specroute_emulator", EmulatorState)


class _Dropped(Exception):
    """An injected connection drop ended the response."""


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def _generate(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    state = request.app[EMULATOR]
    try:
        body = await request.json()
    except ValueError as exc:
        raise ApiError(f"Invalid JSON body: {exc}") from exc
    req = protocol.parse_generation(body, endpoint, state.config)
    plan = state.faults.claim()
    if plan.fail_status:
        message = f"Emulated fault: this server answers {plan.fail_status}"
        return web.json_response(
            protocol.error_body(message, plan.fail_status), status=plan.fail_status
        )
    if plan.drops_at(0):
        drop_connection(request)
        return web.Response()
    if plan.stalls_at(0):
        await asyncio.sleep(plan.stall_s)
    seq = _new_sequence(state, req, request.headers.get(ACCEPTANCE_HEADER))
    prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
    rid = f"{prefix}-{request.headers.get('X-Request-Id') or uuid.uuid4().hex}"
    state.engine.submit(seq)
    try:
        if req.stream:
            return await _stream(request, state, req, seq, rid, plan)
        return await _complete(request, state, req, seq, rid, plan)
    finally:
        state.engine.abort(seq)


def _new_sequence(state: EmulatorState, req: GenerationRequest, pinned: str | None) -> Sequence:
    """Plan the answer (from the request alone) and draw its acceptance (also by arrival)."""
    c = state.config
    text_rng = random.Random(f"{c.seed}|text|{req.digest}")
    kind = classify(structured=req.structured, prompt_text=req.prompt_text)
    answer = plan_answer(
        kind=kind,
        json_schema=req.json_schema,
        natural_tokens=text_rng.randint(c.text_min_tokens, c.text_max_tokens),
        max_tokens=req.max_tokens,
        min_tokens=req.min_tokens,
        ignore_eos=req.ignore_eos,
        stop=req.stop,
        rng=text_rng,
    )
    accept_rng = random.Random(f"{c.seed}|accept|{next(state.arrivals)}|{req.digest}")
    acceptance = request_acceptance(c, kind, req.temperature, accept_rng)
    if pinned is not None:
        try:
            acceptance = min(max(float(pinned), 0.0), 0.99)
        except ValueError as exc:
            raise ApiError(f"{ACCEPTANCE_HEADER} must be a number") from exc
    return Sequence(
        prompt_tokens=req.prompt_tokens,
        plan=answer,
        acceptance=acceptance,
        rng=accept_rng,
        max_tokens_param=req.max_tokens_param,
        k=c.num_speculative_tokens,
    )


async def _next_output(seq: Sequence) -> StepOutput:
    out = await seq.outputs.get()
    if out.finish_reason == "error":
        raise ApiError("The engine shut down before the request finished", 500)
    return out


async def _complete(
    request: web.Request,
    state: EmulatorState,
    req: GenerationRequest,
    seq: Sequence,
    rid: str,
    plan: FaultPlan,
) -> web.StreamResponse:
    """Non-streamed: wait for the whole answer. Faults at N >= 1 chunks act once it is ready."""
    created = int(time.time())
    parts: list[str] = []
    out = await _next_output(seq)
    parts.append(out.text)
    while out.finish_reason is None:
        out = await _next_output(seq)
        parts.append(out.text)
    if plan.stall_s > 0 and plan.stall_after_chunks > 0:
        await asyncio.sleep(plan.stall_s)
    if plan.drop_after_chunks > 0:
        drop_connection(request)
        return web.Response()
    assert out.finish_reason is not None
    usage = bodies.usage(req.prompt_tokens, seq.generated)
    metrics = bodies.spec_metrics(seq.spec, _spec_level(state), full_dump=True)
    build = bodies.chat_body if req.endpoint == "chat" else bodies.completion_body
    body = build(
        rid,
        created,
        state.config.model,
        "".join(parts),
        out.finish_reason,
        out.stop_reason,
        usage,
        metrics,
    )
    return web.json_response(body, dumps=_dumps)


async def _stream(
    request: web.Request,
    state: EmulatorState,
    req: GenerationRequest,
    seq: Sequence,
    rid: str,
    plan: FaultPlan,
) -> web.StreamResponse:
    """Streamed: one SSE event per engine step, then the usage chunk and [DONE]."""
    created, model, endpoint = int(time.time()), state.config.model, req.endpoint
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    sent = 0

    async def send(event: bytes) -> None:
        nonlocal sent
        if sent and plan.stalls_at(sent):
            await asyncio.sleep(plan.stall_s)
        if sent and plan.drops_at(sent):
            drop_connection(request)
            raise _Dropped
        if sent and plan.errors_at(sent):
            raise ApiError("Internal server error", 500)
        await resp.write(event)
        sent += 1

    def usage(completion: int) -> dict[str, Any] | None:
        if not req.continuous_usage:
            return None
        return bodies.usage(req.prompt_tokens, completion, details_field=endpoint == "chat")

    completion = 0
    try:
        out = await _next_output(seq)
        if endpoint == "chat":
            await send(
                _sse(
                    bodies.chunk(endpoint, rid, created, model, text="", role=True, usage_=usage(0))
                )
            )
        while True:
            completion += out.num_tokens
            event = bodies.chunk(
                endpoint,
                rid,
                created,
                model,
                text=out.text,
                finish=out.finish_reason,
                stop_reason=out.stop_reason,
                usage_=usage(completion),
            )
            await send(_sse(event))
            if out.finish_reason is not None:
                break
            out = await _next_output(seq)
        if req.include_usage:
            metrics = bodies.spec_metrics(seq.spec, _spec_level(state), full_dump=False)
            final = bodies.usage(req.prompt_tokens, completion)
            await send(_sse(bodies.usage_chunk(endpoint, rid, created, model, final, metrics)))
        await send(b"data: [DONE]\n\n")
        await resp.write_eof()
    except ApiError as exc:
        await resp.write(_sse(protocol.error_body(exc.message, exc.status)) + b"data: [DONE]\n\n")
    except _Dropped:
        pass
    return resp


def _spec_level(state: EmulatorState) -> str:
    c = state.config
    return c.per_request_spec_decode_metrics if c.speculative else "none"


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + _dumps(obj).encode() + b"\n\n"


def _dumps(obj: Any) -> str:
    """Compact JSON, as vLLM's pydantic and starlette serialisers write it."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
