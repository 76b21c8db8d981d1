"""The official OpenAI SDK and raw HTTP against a real vLLM server, directly and
through the gateway forced to that server: the same answers, ids and timestamps aside.

Greedy (temperature 0) so that both calls produce the same tokens; n=2, which
vLLM refuses greedy ("n must be 1 when using greedy sampling"), is sampled with a seed. The table it
prints (call, direct status, gateway status, same?) is the closing note's. The
stored-response check runs when the pair keeps responses
(VLLM_ENABLE_RESPONSES_API_STORE=1 in deploy/cpu/run_tier.sh's environment).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
from pydantic import BaseModel

from classifier.tokens import load_tiktoken_counter
from gateway.app import create_app
from gateway.config import parse_config
from gateway.request.dispatch import ROUTE_HEADER
from tests.vllm.conftest import Backends
from tooling.local_stack import serve_app

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

# What differs between two runs of the same request: ids, clocks, timing metrics.
_VOLATILE = {"id", "created", "created_at", "completed_at", "metrics", "system_fingerprint"}
Outcome = tuple[int, Any]  # HTTP status, the answer with the volatile fields removed


class Person(BaseModel):
    name: str
    born: int


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


@pytest.fixture
async def gateway_url(backends: Backends) -> AsyncIterator[str]:
    config = parse_config(
        {
            "backends": {
                "speculative": {"urls": [backends.speculative]},
                "baseline": {"urls": [backends.baseline]},
            },
            "routing": {"policy": "rules"},
            "shadow": {"enabled": False},
        }
    )
    runner, url = await serve_app(create_app(config, tokens=load_tiktoken_counter()))
    try:
        yield url
    finally:
        await runner.cleanup()


def _client(base_url: str, route: str | None = None) -> openai.AsyncOpenAI:
    headers = {ROUTE_HEADER: route} if route else None
    return openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="none", max_retries=0, default_headers=headers
    )


Call = Callable[[openai.AsyncOpenAI], Awaitable[Any]]


async def _sdk(client: openai.AsyncOpenAI, call: Call) -> Outcome:
    try:
        answer = await call(client)
    except openai.APIStatusError as exc:
        return exc.status_code, _stable(exc.body)
    except Exception as exc:  # a row of the table, not the end of it
        return -1, f"{type(exc).__name__}: {exc}"
    dumped = answer.model_dump(mode="json") if isinstance(answer, BaseModel) else answer
    return 200, _stable(dumped)


def _calls(model: str) -> dict[str, Call]:
    chat = [{"role": "user", "content": "Name three primary colours."}]
    person = [{"role": "user", "content": "Ada Lovelace, born 1815, as JSON."}]

    async def stream_events(client: openai.AsyncOpenAI) -> Any:
        stream = await client.responses.create(
            model=model, input="Say hello.", max_output_tokens=16, temperature=0, stream=True
        )
        kinds, text = [], ""
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
        return {"types": sorted(set(kinds)), "text": text, "last": kinds[-1]}

    async def parsed(client: openai.AsyncOpenAI) -> Any:
        answer = await client.chat.completions.parse(
            model=model, messages=person, response_format=Person, max_tokens=40, temperature=0
        )
        got = answer.choices[0].message.parsed
        return {
            "parsed": got and got.model_dump(),
            "full": answer.model_dump(mode="json", warnings=False),
        }

    def chat_call(name: str = model, **extra: Any) -> Call:
        return lambda c: c.chat.completions.create(
            model=name, messages=chat, temperature=0, **extra
        )

    def completion(temperature: float = 0, **extra: Any) -> Call:
        return lambda c: c.completions.create(
            model=model, prompt="The capital of France is", temperature=temperature, **extra
        )

    return {
        "chat": chat_call(max_tokens=16),
        "chat.completions.parse (pydantic)": parsed,
        "responses.create": lambda c: c.responses.create(
            model=model, input="Say hello.", max_output_tokens=16, temperature=0
        ),
        "responses.create stream": stream_events,
        "completions echo+logprobs": completion(max_tokens=5, echo=True, logprobs=2),
        # vLLM refuses n > 1 with greedy sampling: sampled, with a seed, repeats itself.
        "completions n=2 (seeded)": completion(1.0, max_tokens=5, n=2, seed=7),
        "completions stop": completion(max_tokens=16, stop=["."]),
        "unknown model (404)": chat_call("no-such-model", max_tokens=4),
        "max_tokens over context (400)": chat_call(max_tokens=100_000),
    }


async def _raw(
    http: aiohttp.ClientSession, base_url: str, method: str, path: str, body: Any, route: str
) -> Outcome:
    async with http.request(
        method, base_url + path, json=body, headers={ROUTE_HEADER: route}
    ) as resp:
        try:
            answer = await resp.json(content_type=None)
        except ValueError:
            answer = await resp.text()
        return resp.status, _stable(answer)


async def test_direct_and_through_the_gateway_give_the_same(
    backends: Backends, gateway_url: str, http: aiohttp.ClientSession
) -> None:
    model, rows = backends.model, []
    for route in ("baseline", "speculative"):
        direct_url = backends.url(route)
        direct, through = _client(direct_url), _client(gateway_url, route)
        calls = _calls(model)
        if route == "speculative":  # the other route: the Responses API only
            calls = {k: v for k, v in calls.items() if k.startswith("responses")}
        for name, call in calls.items():
            rows.append((f"{name} [{route}]", await _sdk(direct, call), await _sdk(through, call)))
        await direct.close()
        await through.close()
    raw = [
        ("POST", "/tokenize", {"model": model, "prompt": "Hello world"}),
        ("POST", "/detokenize", {"model": model, "tokens": [19556, 905]}),
        ("GET", "/version", None),
    ]
    for method, path, body in raw:
        rows.append(
            (
                f"{method} {path} [baseline]",
                await _raw(http, backends.baseline, method, path, body, "baseline"),
                await _raw(http, gateway_url, method, path, body, "baseline"),
            )
        )
    admin = (
        await _raw(http, backends.baseline, "POST", "/reset_prefix_cache", None, "baseline"),
        await _raw(http, gateway_url, "POST", "/reset_prefix_cache", None, "baseline"),
    )
    _print_table(rows, admin)
    assert [name for name, d, g in rows if d != g] == []
    statuses = {name: d[0] for name, d, _ in rows}
    assert statuses["unknown model (404) [baseline]"] == 404
    assert statuses["max_tokens over context (400) [baseline]"] == 400
    assert all(s == 200 for n, s in statuses.items() if "(4" not in n), statuses
    assert admin[1][0] == 403 and admin[1][1]["error"]["code"] == "forbidden_path"


def _print_table(rows: list[tuple[str, Outcome, Outcome]], admin: tuple[Outcome, Outcome]) -> None:
    lines = [f"{'call':48} {'direct':>6} {'gateway':>7}  same?"]
    for name, direct, through in rows:
        same = "yes" if direct == through else "NO"
        lines.append(f"{name:48} {direct[0]:>6} {through[0]:>7}  {same}")
    lines.append(
        f"{'POST /reset_prefix_cache (admin) [baseline]':48} {admin[0][0]:>6} {admin[1][0]:>7}"
        "  403 by design"
    )
    print("\n" + "\n".join(lines))


async def test_a_stored_response_is_continued_on_the_server_that_made_it(
    backends: Backends, gateway_url: str, http: aiohttp.ClientSession
) -> None:
    body: dict[str, Any] = {
        "model": backends.model,
        "input": "Remember: 7.",
        "max_output_tokens": 8,
        "temperature": 0,
    }
    base = {ROUTE_HEADER: "baseline"}
    async with http.post(f"{gateway_url}/v1/responses", json=body, headers=base) as resp:
        assert resp.status == 200, await resp.text()
        first = await resp.json()
    first_id = first["id"]
    async with http.get(f"{backends.baseline}/v1/responses/{first_id}") as resp:
        if resp.status == 404:
            pytest.skip("the pair keeps no responses (VLLM_ENABLE_RESPONSES_API_STORE unset)")
    body.update(input="What number?", previous_response_id=first_id)
    headers = {ROUTE_HEADER: "speculative"}  # the router's wish; the maker answers
    async with http.post(f"{gateway_url}/v1/responses", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers[ROUTE_HEADER] == "baseline"
        assert resp.headers["x-specroute-reason"] == "stored_response"
    async with http.get(f"{gateway_url}/v1/responses/{first_id}", headers=headers) as resp:
        assert resp.status == 200 and (await resp.json())["id"] == first_id
    async with http.get(f"{backends.speculative}/v1/responses/{first_id}") as resp:
        assert resp.status == 404  # it lives on the baseline server only
    print(f"\nstored response {first_id}: continued and retrieved on baseline through the gateway")
