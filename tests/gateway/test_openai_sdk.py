"""The official openai SDK, sync and async, used exactly as against vLLM."""

from __future__ import annotations

import asyncio

import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

Client = TestClient[web.Request, web.Application]
MESSAGES: list[dict[str, str]] = [{"role": "user", "content": "Say hello"}]
EXPECTED = "Hello from the fake upstream."


def base_url(gateway: Client) -> str:
    return str(gateway.make_url("/v1"))


async def test_async_sdk_non_stream_and_stream(gateway: Client) -> None:
    async with openai.AsyncOpenAI(base_url=base_url(gateway), api_key="unused") as client:
        reply = await client.chat.completions.create(model="fake-model", messages=MESSAGES)  # type: ignore[arg-type]
        assert reply.choices[0].message.content == EXPECTED
        assert reply.usage is not None and reply.usage.completion_tokens == 6

        stream = await client.chat.completions.create(
            model="fake-model",
            messages=MESSAGES,
            stream=True,  # type: ignore[arg-type]
        )
        parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        assert "".join(parts) == EXPECTED

        completion = await client.completions.create(model="fake-model", prompt="Say hello")
        assert completion.choices[0].text == EXPECTED

        models = await client.models.list()
        assert [m.id for m in models.data] == ["fake-model"]


async def test_sync_sdk_non_stream_and_stream(gateway: Client) -> None:
    def run() -> tuple[str, str, str]:
        with openai.OpenAI(base_url=base_url(gateway), api_key="unused") as client:
            reply = client.chat.completions.create(model="fake-model", messages=MESSAGES)  # type: ignore[arg-type]
            stream = client.chat.completions.create(
                model="fake-model",
                messages=MESSAGES,  # type: ignore[arg-type]
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = list(stream)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            usage = chunks[-1].usage
            assert usage is not None and usage.completion_tokens == 6
            completion = client.completions.create(model="fake-model", prompt="hi", stream=True)
            ctext = "".join(c.choices[0].text for c in completion if c.choices)
            return reply.choices[0].message.content or "", text, ctext

    # The sync client blocks, so it runs in a thread while the loop serves it.
    assert await asyncio.to_thread(run) == (EXPECTED, EXPECTED, EXPECTED)


async def test_sdk_sees_gateway_errors_as_api_errors(gateway: Client) -> None:
    async with openai.AsyncOpenAI(
        base_url=base_url(gateway), api_key="unused", max_retries=0
    ) as client:
        with pytest.raises(openai.BadRequestError, match="messages"):
            await client.chat.completions.create(model="fake-model", messages=[])
