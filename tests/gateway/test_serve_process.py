"""`specroute serve` as a process: the end of a drain, SIGHUP with nothing to re-read,
idle keep-alive connections, malformed HTTP.

Before the fixes: streams cut at the end of `drain_s` ended as a broken
chunked body (no error event, no [DONE], logged as client_disconnect); SIGHUP
killed a gateway started with `--backend` only (exit 129, no drain); an idle
keep-alive connection stayed open for an hour; malformed HTTP wrote a 12-line
non-JSON traceback with the client's header bytes into the log.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.gateway import test_lifecycle
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_lifecycle import Gateway, GatewayFactory
from tests.gateway.test_routing import chat, post_hi
from tests.support import wait_until
from tooling.local_stack import wait_healthy

start_gateway = test_lifecycle.start_gateway  # the fixture: `specroute serve` on a config file
SLOW_WORDS = [f" w{i}" for i in range(40)]  # 40 events x 0.2 s: far past the drain


@pytest.fixture
async def slow_gateway(start_gateway: GatewayFactory, spec_upstream: FakeUpstream) -> Gateway:
    """A 0.5 s drain in front of a speculative server that needs 8 s per answer."""
    spec_upstream.words, spec_upstream.chunk_delay_s = SLOW_WORDS, 0.2
    return await start_gateway(0.5)


async def test_drain_ends_streams_with_an_error_event_and_done(slow_gateway: Gateway) -> None:
    gateway = slow_gateway
    async with aiohttp.ClientSession() as session:
        stream = await post_hi(session, gateway.url, "speculative", stream=True)
        await stream.content.readline()
        gateway.proc.send_signal(signal.SIGTERM)
        body = await stream.read()
    assert body.endswith(b"data: [DONE]\n\n")
    error = json.loads(body.split(b"data: ")[-2])["error"]
    assert error["code"] == "drained"
    assert await gateway.proc.wait() == 0
    log = await gateway.stderr()
    records = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    (line,) = [r for r in records if r.get("event") == "request"]
    assert (line["error"], line["status"]) == ("drained", "stream_error")


async def test_drain_answers_a_whole_answer_still_waiting_with_503(
    slow_gateway: Gateway, spec_upstream: FakeUpstream
) -> None:
    gateway = slow_gateway
    async with aiohttp.ClientSession() as session:
        pending = asyncio.create_task(post_hi(session, gateway.url, "speculative"))
        await wait_until(lambda: bool(spec_upstream.received), "the backend got the request")
        gateway.proc.send_signal(signal.SIGTERM)
        resp = await pending
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "drained"
    assert await gateway.proc.wait() == 0


async def test_sighup_without_a_config_file_keeps_serving(
    tmp_path: Path, spec_server: TestServer, base_server: TestServer, unused_tcp_port: int
) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "--backend",
        f"speculative={spec_server.make_url('')}",
        "--backend",
        f"baseline={base_server.make_url('')}",
        "--port",
        str(unused_tcp_port),
        cwd=tmp_path,  # no config.toml here: only what the command line gave
        stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
    )
    gateway = Gateway(proc, f"http://127.0.0.1:{unused_tcp_port}")
    try:
        await wait_healthy(gateway.url)
        proc.send_signal(signal.SIGHUP)
        await wait_until(lambda: gateway.logged("config_reload_skipped") == 1, "the reload line")
        async with aiohttp.ClientSession() as session:
            resp = await session.post(f"{gateway.url}/v1/chat/completions", json=chat("hi"))
            assert resp.status == 200
        assert proc.returncode is None
        proc.send_signal(signal.SIGTERM)
        assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await gateway.stderr()


async def test_idle_keepalive_connections_are_closed(start_gateway: GatewayFactory) -> None:
    gateway = await start_gateway(5.0, "keepalive_s = 0.5")
    port = int(gateway.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    async with asyncio.timeout(5.0):  # aiohttp's default would be 3,630 s
        while await reader.read(65536):
            pass  # the rest of the answer, then the server's close
    writer.close()


async def test_malformed_http_is_one_json_line_without_the_header_bytes(
    start_gateway: GatewayFactory,
) -> None:
    gateway = await start_gateway(5.0)
    port = int(gateway.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Secret-Garbage\x01\x02 no colon\r\n\r\n")
    await writer.drain()
    assert b" 400 " in await reader.readline()
    writer.close()
    await wait_until(lambda: gateway.logged("BadHttpMessage") >= 1, "the error line")
    gateway.proc.send_signal(signal.SIGTERM)
    await gateway.proc.wait()
    log = await gateway.stderr()
    banner, *lines = log.splitlines()  # the human start line, then JSON only
    assert banner.startswith("specroute gateway on ")
    assert all(line.startswith("{") for line in lines), lines
    (error,) = [json.loads(x) for x in lines if "Error handling request" in x]
    assert error["error"] == "BadHttpMessage" and error["http_status"] == 400
    assert "Secret-Garbage" not in log
