"""What Envoy sends the picker (issue 53): a request it does not route costs one message,
its request headers, and nothing of its answer; a routed one still gets its four, three
when the answer is an error (its body is not read)."""

from __future__ import annotations

import aiohttp

from tests.extproc.conftest import StackFactory
from tooling.envoy import chat

_RECEIVED = "http.specroute.ext_proc.stream_msgs_received"


async def _received(admin: str) -> int:
    """Envoy's count of the ext_proc messages it sent the picker (its admin stats)."""
    async with aiohttp.ClientSession() as s, s.get(f"{admin}/stats?filter={_RECEIVED}") as r:
        text = await r.text()
    return sum(int(line.rsplit(":", 1)[1]) for line in text.splitlines() if _RECEIVED in line)


async def test_an_unrouted_request_costs_the_picker_one_message(stack_for: StackFactory) -> None:
    stack = await stack_for()
    admin, url = stack.envoy.admin, stack.envoy.url
    async with aiohttp.ClientSession() as s:
        before = await _received(admin)
        for _ in range(5):
            async with s.get(f"{url}/v1/models") as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["data"]
        assert await _received(admin) - before == 5  # the request headers; 15 before
        before = await _received(admin)
        async with s.post(f"{url}/v1/chat/completions", json=chat()) as r:
            assert r.status == 200
            assert r.headers["x-specroute-route"] == "speculative"
            await r.read()
    # request headers, request body, response headers, response body: all read
    assert await _received(admin) - before == 4


async def test_an_error_answer_costs_the_picker_three_messages(stack_for: StackFactory) -> None:
    """A routed request whose backend answers an error: its body is not sent to the picker
    (the headers' reply says so), and the request is settled with its headers."""
    stack = await stack_for()
    admin, url = stack.envoy.admin, stack.envoy.url
    async with aiohttp.ClientSession() as s:
        before = await _received(admin)
        async with s.post(f"{url}/v1/chat/completions", json=chat(model="no-such-model")) as r:
            assert r.status == 404, await r.text()
            assert "does not exist" in (await r.json())["error"]["message"]  # vLLM's own
            assert r.headers["x-specroute-route"]
    # request headers, request body, response headers: not the answer's body
    assert await _received(admin) - before == 3
