"""The openai SDK talks to the emulator as it would to vLLM."""

from __future__ import annotations

from typing import TYPE_CHECKING

from openai import AsyncOpenAI

if TYPE_CHECKING:
    from conftest import StartEmulator


async def test_openai_sdk_stream_and_non_stream(emulator: StartEmulator) -> None:
    client = await emulator("speculative", per_request_spec_decode_metrics="detailed")
    base_url = str(client.make_url("/v1"))
    async with AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as sdk:
        models = await sdk.models.list()
        assert [m.id for m in models.data] == ["smollm2-135m"]

        reply = await sdk.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=20,
            temperature=0,
        )
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage is not None and reply.usage.completion_tokens <= 20
        assert reply.choices[0].message.content

        stream = await sdk.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage
        assert text == reply.choices[0].message.content  # same request, same answer
        assert usage is not None and usage.completion_tokens == reply.usage.completion_tokens

        completion = await sdk.completions.create(model="smollm2-135m", prompt="Hi", max_tokens=5)
        assert completion.usage is not None and completion.usage.completion_tokens == 5
        assert completion.choices[0].finish_reason == "length"
