"""The emulator answers like vLLM's OpenAI server: bodies, usage, errors, extra routes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from tooling.emulator.textgen import split_tokens

if TYPE_CHECKING:
    from conftest import ReadSse, StartEmulator

SCHEMA = {
    "type": "object",
    "properties": {
        "customer": {"type": "string"},
        "total": {"type": "number"},
        "paid": {"type": "boolean"},
        "status": {"enum": ["open", "closed"]},
        "lines": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
            },
        },
    },
    "required": ["customer", "total"],
}


async def test_chat_body_has_vllm_fields_and_exact_usage(
    emulator: StartEmulator, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("baseline")
    resp = await client.post("/v1/chat/completions", json=chat_body("hello there", temperature=0))
    assert resp.status == 200
    body = await resp.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "smollm2-135m" and body["metrics"] is None
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
    assert choice["stop_reason"] is None and choice["logprobs"] is None
    text = choice["message"]["content"]
    usage = body["usage"]
    # A natural stop ends with the EOS token: counted, but no text.
    assert usage["completion_tokens"] == len(split_tokens(text)) + 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_same_request_same_answer_on_both_servers(
    emulator: StartEmulator, chat_body: Callable[..., dict[str, Any]]
) -> None:
    """Both servers serve one model greedily: identical text, whatever else differs."""
    base, spec = await emulator("baseline"), await emulator("speculative")
    body = chat_body("tell me about caches", temperature=0, max_tokens=80)
    answers = []
    for client in (base, spec, base):
        resp = await client.post("/v1/chat/completions", json=body)
        answers.append((await resp.json())["choices"][0]["message"]["content"])
    assert answers[0] == answers[1] == answers[2]


@pytest.mark.parametrize("endpoint", ["chat", "completion"])
async def test_max_tokens_gives_length(
    emulator: StartEmulator, endpoint: str, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("speculative")
    if endpoint == "chat":
        resp = await client.post("/v1/chat/completions", json=chat_body("hi", max_tokens=7))
    else:
        resp = await client.post("/v1/completions", json={"prompt": "Once", "max_tokens": 7})
    body = await resp.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 7


async def test_completions_default_max_tokens_is_16(emulator: StartEmulator) -> None:
    client = await emulator("baseline", text_min_tokens=100, text_max_tokens=100)
    body = await (await client.post("/v1/completions", json={"prompt": "Hello"})).json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert (
        body["usage"]["completion_tokens"] == 16 and body["choices"][0]["finish_reason"] == "length"
    )


async def test_ignore_eos_and_min_tokens(
    emulator: StartEmulator, chat_body: Callable[..., dict[str, Any]]
) -> None:
    client = await emulator("baseline", text_min_tokens=10, text_max_tokens=10)
    resp = await client.post(
        "/v1/chat/completions", json=chat_body("x", max_tokens=50, ignore_eos=True)
    )
    assert (await resp.json())["usage"]["completion_tokens"] == 50
    resp = await client.post(
        "/v1/chat/completions", json=chat_body("x", max_tokens=50, min_tokens=30)
    )
    body = await resp.json()
    assert (
        body["usage"]["completion_tokens"] == 31 and body["choices"][0]["finish_reason"] == "stop"
    )


async def test_stop_string_cuts_text_and_sets_stop_reason(emulator: StartEmulator) -> None:
    """vLLM ends at the first stop string and leaves it out; max_tokens keeps a prefix."""
    client = await emulator("baseline")
    body = {"prompt": "tell me something", "max_tokens": 200, "temperature": 0}
    full = (await (await client.post("/v1/completions", json=body)).json())["choices"][0]["text"]
    stop = full[20:26]
    cut = await (await client.post("/v1/completions", json={**body, "stop": [stop]})).json()
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert choice["text"] == full[: full.find(stop)]
    short = await (await client.post("/v1/completions", json={**body, "max_tokens": 5})).json()
    assert full.startswith(short["choices"][0]["text"])


async def test_json_object_and_json_schema_parse(
    emulator: StartEmulator, chat_body: Callable[..., dict[str, Any]], read_sse: ReadSse
) -> None:
    client = await emulator("speculative")
    json_object = {"type": "json_object"}
    json_schema = {"type": "json_schema", "json_schema": {"name": "order", "schema": SCHEMA}}
    for fmt in (json_object, json_schema):
        for seed in range(5):
            body = chat_body(f"order {seed}", temperature=0, response_format=fmt)
            resp = await client.post("/v1/chat/completions", json=body)
            content = (await resp.json())["choices"][0]["message"]["content"]
            doc = json.loads(content)
            assert isinstance(doc, dict)
            if fmt is json_schema:
                assert set(doc) == set(SCHEMA["properties"])  # type: ignore[arg-type]
                assert isinstance(doc["total"], float) and doc["status"] in ("open", "closed")
                assert all(line["qty"] >= 1 for line in doc["lines"])
    stream = chat_body("order", temperature=0, response_format=json_schema, stream=True)
    events = await read_sse(await client.post("/v1/chat/completions", json=stream))
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"])
    json.loads(text)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens"),
        (
            {"messages": [{"role": "user", "content": "x"}], "stream_options": {}},
            400,
            "stream_options",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}, 400, "max_tokens"),
        ({"messages": [{"role": "user", "content": "word " * 9000}]}, 400, "input_tokens"),
    ],
)
async def test_errors_in_vllm_shape(
    emulator: StartEmulator, body: dict[str, Any], status: int, param: str
) -> None:
    client = await emulator("baseline")
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status == status
    error = (await resp.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["param"] == param
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


async def test_bad_json_and_unknown_route(emulator: StartEmulator) -> None:
    client = await emulator("baseline")
    resp = await client.post("/v1/completions", data=b"{not json")
    assert resp.status == 400 and (await resp.json())["error"]["type"] == "BadRequestError"
    resp = await client.get("/v1/nothing")
    assert resp.status == 404 and await resp.json() == {"detail": "Not Found"}


async def test_models_health_version(emulator: StartEmulator) -> None:
    client = await emulator("speculative", model="my-model", max_model_len=4096)
    models = await (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    assert [(m["id"], m["owned_by"], m["max_model_len"]) for m in models["data"]] == [
        ("my-model", "vllm", 4096)
    ]
    assert (await client.get("/health")).status == 200
    assert "emulated" in (await (await client.get("/version")).json())["version"]


async def test_token_id_prompt_and_request_id_header(emulator: StartEmulator) -> None:
    client = await emulator("baseline")
    resp = await client.post(
        "/v1/completions",
        json={"prompt": [1, 2, 3, 4, 5], "max_tokens": 3},
        headers={"X-Request-Id": "abc"},
    )
    body = await resp.json()
    assert body["id"] == "cmpl-abc" and body["usage"]["prompt_tokens"] == 5
