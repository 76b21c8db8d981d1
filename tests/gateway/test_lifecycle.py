"""`specroute serve` as a real process: SIGTERM drains, SIGHUP reloads the config."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.test_routing import chat, post_hi
from tests.support import wait_until
from tooling.local_stack import wait_healthy

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ROUTED = chat("hello there", temperature=0.5, max_tokens=6)  # reason "default"


def write_config(
    path: Path, spec: TestServer, base: TestServer, port: int, extra: str = ""
) -> None:
    path.write_text(
        f"""
[server]
port = {port}
drain_s = 5.0
[backends.speculative]
urls = ["{spec.make_url("")}"]
[backends.baseline]
urls = ["{base.make_url("")}"]
[routing]
policy = "rules"
{extra}
"""
    )


class Gateway:
    """The process and its stderr, drained as it comes so the pipe never fills."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str) -> None:
        self.proc = proc
        self.url = url
        self._log = bytearray()
        assert proc.stderr is not None
        self._reader = asyncio.create_task(self._drain(proc.stderr))

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self._log += chunk

    def logged(self, event: str) -> int:
        """How many times `event` is in the log so far (its lines are JSON)."""
        return self._log.count(f'"{event}"'.encode())

    async def stderr(self) -> str:
        await self._reader
        return self._log.decode()


GatewayFactory = Callable[..., Awaitable[Gateway]]  # (drain_s, server_extra='')


@pytest.fixture
async def start_gateway(
    tmp_path: Path, spec_server: TestServer, base_server: TestServer, unused_tcp_port: int
) -> AsyncIterator[GatewayFactory]:
    """Start `specroute serve` on tmp_path/config.toml with a given drain time; stop it after."""
    started: list[Gateway] = []

    async def start(drain_s: float, server_extra: str = "") -> Gateway:
        config = tmp_path / "config.toml"
        write_config(config, spec_server, base_server, unused_tcp_port)
        server = f"drain_s = {drain_s}\n{server_extra}"
        config.write_text(config.read_text().replace("drain_s = 5.0", server))
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--config",
            str(config),
            cwd=ROOT,
            stderr=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
        )
        gateway = Gateway(proc, f"http://127.0.0.1:{unused_tcp_port}")
        started.append(gateway)
        await wait_healthy(gateway.url)
        return gateway

    yield start
    for gateway in started:
        if gateway.proc.returncode is None:
            gateway.proc.kill()
            await gateway.proc.wait()
        await gateway.stderr()


@pytest.fixture
async def gateway_process(start_gateway: GatewayFactory) -> Gateway:
    return await start_gateway(5.0)


async def test_sigterm_drains_in_flight_and_refuses_new_work(
    gateway_process: Gateway, spec_upstream: FakeUpstream
) -> None:
    spec_upstream.chunk_delay_s = 0.3  # ~2 s stream
    async with aiohttp.ClientSession() as session:
        stream = await post_hi(session, gateway_process.url, "speculative", stream=True)
        await stream.content.readline()
        gateway_process.proc.send_signal(signal.SIGTERM)

        async def not_ready() -> bool:
            async with session.get(f"{gateway_process.url}/ready") as ready:
                return ready.status == 503

        await wait_until(not_ready, "/ready to answer 503 once SIGTERM is handled")
        refused = await session.post(f"{gateway_process.url}/v1/chat/completions", json=chat("x"))
        assert refused.status == 503
        assert (await refused.json())["error"]["code"] == "draining"
        rest = await stream.read()
        assert rest.endswith(b"data: [DONE]\n\n")
    assert await asyncio.wait_for(gateway_process.proc.wait(), 10) == 0


async def test_sigterm_cancels_what_outlives_the_drain_time(
    start_gateway: GatewayFactory, spec_upstream: FakeUpstream
) -> None:
    gateway = await start_gateway(0.5)
    spec_upstream.chunk_delay_s = 0.3
    spec_upstream.words = ["tok"] * 100  # 30 s
    async with aiohttp.ClientSession() as session:
        stream = await post_hi(session, gateway.url, "speculative", stream=True)
        await stream.content.readline()
        gateway.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(spec_upstream.cancelled.wait(), 5)  # vLLM would abort it
        assert await asyncio.wait_for(gateway.proc.wait(), 10) == 0
        stream.close()


async def test_sighup_reloads_and_a_bad_file_keeps_the_old_config(
    gateway_process: Gateway,
    tmp_path: Path,
    spec_server: TestServer,
    base_server: TestServer,
    spec_upstream: FakeUpstream,
    base_upstream: FakeUpstream,
    unused_tcp_port: int,
) -> None:
    config = tmp_path / "config.toml"
    url = gateway_process.url
    port = int(url.rsplit(":", 1)[1])
    spec_upstream.chunk_delay_s = 0.05

    async def one(session: aiohttp.ClientSession) -> str:
        async with session.post(
            f"{url}/v1/chat/completions", json={**DEFAULT_ROUTED, "stream": True}
        ) as resp:
            assert resp.status == 200
            assert (await resp.read()).endswith(b"data: [DONE]\n\n")
            return resp.headers["x-specroute-route"]

    async with aiohttp.ClientSession() as session:
        assert await one(session) == "speculative"
        # Reload under load: 30 requests in flight while the route flips.
        load = [asyncio.create_task(one(session)) for _ in range(30)]
        await wait_until(
            lambda: len(spec_upstream.received) + len(base_upstream.received) >= 31,
            "the 30 requests at the upstreams",
        )
        write_config(
            config,
            spec_server,
            base_server,
            port,
            '[routing.tuning.rules]\ndefault_route = "baseline"',
        )
        gateway_process.proc.send_signal(signal.SIGHUP)
        routes = await asyncio.gather(*load)  # none failed
        assert set(routes) <= {"speculative", "baseline"}
        await wait_until(lambda: gateway_process.logged("config_reloaded") == 1, "the reload")
        assert await one(session) == "baseline"

        config.write_text("[server\nbroken")
        gateway_process.proc.send_signal(signal.SIGHUP)
        await wait_until(
            lambda: gateway_process.logged("config_reload_rejected") == 1, "the bad file rejected"
        )
        assert await one(session) == "baseline"  # the old (reloaded) config stays

        write_config(config, spec_server, base_server, port + 1)  # a restart-only change
        gateway_process.proc.send_signal(signal.SIGHUP)
        await wait_until(
            lambda: gateway_process.logged("config_reload_rejected") == 2,
            "the restart-only change rejected",
        )
        assert await one(session) == "baseline"  # refused whole, not applied in part

    gateway_process.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(gateway_process.proc.wait(), 10) == 0
    log = await gateway_process.stderr()
    rejected = [json.loads(line) for line in log.splitlines() if "config_reload_rejected" in line]
    assert len(rejected) == 2
    assert "not valid TOML" in rejected[0]["error"]
    assert "need a restart" in rejected[1]["error"]
