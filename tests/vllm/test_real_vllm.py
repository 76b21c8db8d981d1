"""Real-engine tier: the CPU vLLM pair from deploy/cpu/up.sh, spoken to directly.

Needs SPECROUTE_VLLM_BACKENDS="speculative=URL,baseline=URL" (see conftest.py;
without it the tests skip, or fail in CI). These tests pin down the vLLM
behaviour the gateway relies on: the OpenAI API on both servers, the
per-request speculative-decoding metrics, the /metrics names, and what a
client disconnect does. Requests are short (a few dozen tokens at ~30 tokens/s
on one core) so that the tier stays fast on 2 CPU cores. The servers must be
otherwise idle while it runs.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest

from tests.support import wait_until

pytestmark = pytest.mark.vllm

ROUTES = ["speculative", "baseline"]

# A prompt whose answer repeats the prompt: n-gram speculation accepts almost
# every draft token on it, and greedy decoding gives the same text on both.
COPY_PROMPT = 'Copy this JSON exactly: {"name": "Ada", "born": 1815, "field": "mathematics"}'
COPY_ANSWER = '{"name": "Ada", "born": 1815, "field": "mathematics"}'

SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
)

# Metric families (as they appear on `# TYPE` lines of vLLM 0.32) -> type.
EXPECTED_TYPES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens_total": "counter",
    "vllm:generation_tokens_total": "counter",
    "vllm:request_success_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}


@pytest.fixture
async def oai(backends: Any) -> AsyncIterator[dict[str, openai.AsyncOpenAI]]:
    clients = {
        route: openai.AsyncOpenAI(
            base_url=backends.url(route) + "/v1", api_key="unused", max_retries=0, timeout=60
        )
        for route in ROUTES
    }
    try:
        yield clients
    finally:
        for c in clients.values():
            await c.close()


def chat_body(model: str, **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": COPY_PROMPT}],
        "max_tokens": 32,
        "temperature": 0,
    }
    body.update(kw)
    return body


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any] | str]:
    """Yields each `data:` payload of an SSE response: a dict, or '[DONE]'."""
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        yield payload if payload == "[DONE]" else json.loads(payload)


async def post_stream(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> list[dict[str, Any] | str]:
    async with http.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["content-type"].startswith("text/event-stream")
        return [ev async for ev in sse_events(resp)]


# ---------------------------------------------------------------- API surface


async def test_models_same_name_on_both(oai: dict[str, openai.AsyncOpenAI], backends: Any) -> None:
    for route in ROUTES:
        page = await oai[route].models.list()
        ids = [m.id for m in page.data]
        assert ids == [backends.model], (route, ids)
        assert page.data[0].owned_by == "vllm"
        assert (page.data[0].model_extra or {}).get("max_model_len") == 2048


async def test_chat_non_stream_same_answer_on_both(
    oai: dict[str, openai.AsyncOpenAI], backends: Any
) -> None:
    answers = {}
    for route in ROUTES:
        r = await oai[route].chat.completions.create(
            model=backends.model,
            messages=[{"role": "user", "content": COPY_PROMPT}],
            max_tokens=32,
            temperature=0,
        )
        assert r.object == "chat.completion"
        assert r.model == backends.model
        choice = r.choices[0]
        assert choice.finish_reason in ("stop", "length")
        assert r.usage is not None and 0 < r.usage.completion_tokens <= 32
        answers[route] = choice.message.content
        extra = r.model_extra or {}
        spec = (extra.get("metrics") or {}).get("speculative_decoding")
        if route == "speculative":
            assert spec is not None, "speculative server must run with per-request spec metrics"
        else:
            assert spec is None
    assert answers["speculative"] == answers["baseline"]
    assert answers["speculative"] is not None and COPY_ANSWER in answers["speculative"]


@pytest.mark.parametrize("route", ROUTES)
async def test_chat_stream_sdk(
    oai: dict[str, openai.AsyncOpenAI], backends: Any, route: str
) -> None:
    stream = await oai[route].chat.completions.create(
        model=backends.model,
        messages=[{"role": "user", "content": COPY_PROMPT}],
        max_tokens=32,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, extra = [], None, None, {}
    async with stream:
        async for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage, extra = chunk.usage, chunk.model_extra or {}
    assert COPY_ANSWER in "".join(text)
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens > 0
    spec = (extra.get("metrics") or {}).get("speculative_decoding")
    assert (spec is not None) == (route == "speculative")


@pytest.mark.parametrize("route", ROUTES)
async def test_completions_stream_and_non_stream(
    oai: dict[str, openai.AsyncOpenAI], backends: Any, route: str
) -> None:
    prompt = "one two three four one two three four one two"
    r = await oai[route].completions.create(
        model=backends.model, prompt=prompt, max_tokens=8, temperature=0
    )
    assert r.object == "text_completion"
    assert r.usage is not None and r.usage.completion_tokens == 8
    assert r.choices[0].finish_reason == "length"
    stream = await oai[route].completions.create(
        model=backends.model, prompt=prompt, max_tokens=8, temperature=0, stream=True
    )
    parts: list[str] = []
    async with stream:
        async for chunk in stream:
            parts.extend(c.text for c in chunk.choices)
    assert "".join(parts) == r.choices[0].text


@pytest.mark.parametrize("route", ROUTES)
async def test_response_format_json_schema(
    oai: dict[str, openai.AsyncOpenAI], backends: Any, route: str
) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "born": {"type": "integer"}},
        "required": ["name", "born"],
        "additionalProperties": False,
    }
    r = await oai[route].chat.completions.create(
        model=backends.model,
        messages=[{"role": "user", "content": "Ada Lovelace, born 1815, as JSON."}],
        max_tokens=48,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema},
        },
    )
    assert r.choices[0].finish_reason == "stop", r.choices[0]
    doc = json.loads(r.choices[0].message.content or "")
    assert set(doc) == {"name", "born"}
    assert isinstance(doc["name"], str) and isinstance(doc["born"], int)


async def test_error_shapes(http: aiohttp.ClientSession, backends: Any) -> None:
    url = backends.baseline + "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    async with http.post(
        url, json={"model": backends.model, "messages": msgs, "max_tokens": 5000}
    ) as r:
        assert r.status == 400
        assert r.content_type == "application/json"
        err = (await r.json())["error"]
        assert err["type"] == "BadRequestError"
        assert err["param"] == "max_tokens"
        assert err["code"] == 400
        assert "max_model_len" in err["message"]
    async with http.post(url, json={"model": "no-such-model", "messages": msgs}) as r:
        assert r.status == 404
        err = (await r.json())["error"]
        assert err == {
            "message": err["message"],
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
        assert "no-such-model" in err["message"]
    async with http.post(
        url, data=b'{"model": ', headers={"content-type": "application/json"}
    ) as r:
        assert r.status == 400
        err = (await r.json())["error"]
        assert err["type"] == "Bad Request" and err["code"] == 400


async def test_error_through_sdk(oai: dict[str, openai.AsyncOpenAI], backends: Any) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        await oai["speculative"].chat.completions.create(
            model=backends.model, messages=[{"role": "user", "content": "hi"}], max_tokens=5000
        )
    assert exc.value.status_code == 400
    with pytest.raises(openai.NotFoundError):
        await oai["speculative"].chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )


# ---------------------------------------------------------------- usage in streams


@pytest.mark.parametrize("route", ROUTES)
async def test_continuous_usage_stats(
    http: aiohttp.ClientSession, backends: Any, route: str
) -> None:
    """stream_options.continuous_usage_stats puts cumulative usage on every chunk;
    the last chunk (choices == []) carries the final usage and, on the
    speculative server, metrics.speculative_decoding."""
    events = await post_stream(
        http,
        backends.url(route) + "/v1/chat/completions",
        chat_body(
            backends.model,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        ),
    )
    assert events[-1] == "[DONE]"
    chunks = [e for e in events if isinstance(e, dict)]
    final = chunks[-1]
    assert final["choices"] == []
    body_chunks = chunks[:-1]
    assert body_chunks and all("usage" in c for c in body_chunks)
    counts = [c["usage"]["completion_tokens"] for c in body_chunks]
    assert counts[0] == 0  # the role chunk
    assert counts == sorted(counts)
    assert counts[-1] == final["usage"]["completion_tokens"]
    prompt_tokens = {c["usage"]["prompt_tokens"] for c in chunks}
    assert len(prompt_tokens) == 1
    spec = final.get("metrics", {}).get("speculative_decoding")
    if route == "baseline":
        assert "metrics" not in final
        return
    assert spec is not None
    # With ~100% acceptance on a copy, several steps yield num_spec_tokens + 1
    # tokens at once, and so one chunk each.
    steps = [b - a for a, b in itertools.pairwise(counts)]
    assert max(steps) >= 2, steps
    assert spec["num_accepted_draft_tokens"] > 0


# ---------------------------------------------------------------- /metrics


async def test_metric_names_and_types(
    scrape: Callable[[str], Awaitable[Any]], backends: Any
) -> None:
    for route in ROUTES:
        s = await scrape(backends.url(route))
        for name, typ in EXPECTED_TYPES.items():
            assert s.types.get(name) == typ, (route, name, s.types.get(name))
        labels = {"engine": "0", "model_name": backends.model}
        for reason in ("stop", "length", "abort", "error", "repetition"):
            s.get("vllm:request_success_total", finished_reason=reason, **labels)
        s.get("vllm:num_requests_running", **labels)
        s.get("vllm:time_to_first_token_seconds_count", **labels)
        s.get("vllm:inter_token_latency_seconds_bucket", le="+Inf", **labels)
        has_spec = all(s.types.get(n) == "counter" for n in SPEC_COUNTERS)
        assert has_spec == (route == "speculative"), (route, s.names("vllm:spec_decode"))


async def test_spec_counters_advance_only_on_speculative(
    http: aiohttp.ClientSession, scrape: Callable[[str], Awaitable[Any]], backends: Any
) -> None:
    before = {r: await scrape(backends.url(r)) for r in ROUTES}
    for route in ROUTES:
        async with http.post(
            backends.url(route) + "/v1/chat/completions", json=chat_body(backends.model)
        ) as r:
            assert r.status == 200
            await r.read()
    gen = "vllm:generation_tokens_total"

    async def counted() -> dict[str, Any] | None:
        after = {r: await scrape(backends.url(r)) for r in ROUTES}
        return after if all(after[r].get(gen) > before[r].get(gen) for r in ROUTES) else None

    after = await wait_until(counted, f"{gen} to grow on both servers", interval_s=0.1)
    for name in (
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    ):
        assert after["speculative"].get(name) > before["speculative"].get(name), name
    assert not after["baseline"].names("vllm:spec_decode")


@pytest.mark.parametrize("stream", [False, True])
async def test_per_request_spec_metrics_match_counters(
    http: aiohttp.ClientSession,
    scrape: Callable[[str], Awaitable[Any]],
    backends: Any,
    stream: bool,
) -> None:
    url = backends.speculative
    before = await scrape(url)
    body = chat_body(backends.model)
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
        events = await post_stream(http, url + "/v1/chat/completions", body)
        final = [e for e in events if isinstance(e, dict)][-1]
        spec, usage = final["metrics"]["speculative_decoding"], final["usage"]
    else:
        async with http.post(url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            data = await r.json()
        spec, usage = data["metrics"]["speculative_decoding"], data["usage"]
    # The engine's stats reach /metrics on their own path, a moment after the answer.
    gen = "vllm:generation_tokens_total"

    async def published() -> Any:
        after = await scrape(url)
        return after if after.get(gen) - before.get(gen) >= usage["completion_tokens"] else None

    after = await wait_until(published, f"{gen} to count the answer", interval_s=0.1)

    def delta(name: str, **labels: str) -> float:
        return float(after.get(name, **labels) - before.get(name, **labels))

    k = spec["num_spec_tokens"]
    hist = spec["acceptance_histogram"]
    assert k == 4 and len(hist) == k + 1
    assert sum(hist) == spec["num_spec_steps"]
    assert sum(j * n for j, n in enumerate(hist)) == spec["num_accepted_draft_tokens"]
    assert delta("vllm:spec_decode_num_drafts_total") == spec["num_spec_steps"]
    assert delta("vllm:spec_decode_num_draft_tokens_total") == spec["num_draft_tokens"]
    assert delta("vllm:spec_decode_num_accepted_tokens_total") == spec["num_accepted_draft_tokens"]
    for pos in range(k):
        # position p is accepted in every step that accepted more than p drafts
        assert delta(
            "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)
        ) == sum(hist[pos + 1 :])
    # detailed level: one entry per verify step
    assert len(spec["per_step_accepted"]) == spec["num_spec_steps"]
    assert sum(spec["per_step_drafted"]) == spec["num_draft_tokens"]
    assert delta("vllm:generation_tokens_total") == usage["completion_tokens"]


# ---------------------------------------------------------------- disconnect


@pytest.mark.parametrize("route", ROUTES)
async def test_client_disconnect_aborts_generation(
    http: aiohttp.ClientSession,
    scrape: Callable[[str], Awaitable[Any]],
    backends: Any,
    route: str,
) -> None:
    """Closing the stream mid-way makes vLLM abort the request: the engine stops
    generating at once. vLLM 0.32 does NOT count such an abort in
    vllm:request_success_total{finished_reason="abort"} nor in
    e2e_request_latency; it only shows as a TTFT observation without a
    matching e2e one, and num_requests_running dropping back."""
    url = backends.url(route)
    before = await scrape(url)
    body = {
        "model": backends.model,
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 1500,
        "temperature": 1.0,
        "ignore_eos": True,
        "stream": True,
    }
    seen = 0
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        async for ev in sse_events(resp):
            if isinstance(ev, dict) and ev["choices"]:
                seen += 1
            if seen >= 5:
                break
        mid = await scrape(url)
        assert mid.get("vllm:num_requests_running") == 1
        resp.close()  # drop the connection mid-stream

    async def stopped() -> Any:
        now = await scrape(url)
        return now if now.get("vllm:num_requests_running") == 0 else None

    now = await wait_until(stopped, "the generation to stop", interval_s=0.2)
    gen_stopped = now.get("vllm:generation_tokens_total")
    # An absence is checked over a window: a second in which no token may be generated.
    await asyncio.sleep(1.0)
    later = await scrape(url)
    assert later.get("vllm:generation_tokens_total") == gen_stopped, "engine kept generating"
    generated = gen_stopped - before.get("vllm:generation_tokens_total")
    assert seen - 1 <= generated < 1500, (seen, generated)

    def delta(name: str, **labels: str) -> float:
        return float(later.get(name, **labels) - before.get(name, **labels))

    assert delta("vllm:time_to_first_token_seconds_count") == 1
    assert delta("vllm:e2e_request_latency_seconds_count") == 0
    assert delta("vllm:request_success_total") == 0
    assert delta("vllm:request_success_total", finished_reason="abort") == 0
