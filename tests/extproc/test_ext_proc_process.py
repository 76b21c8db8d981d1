"""`specroute ext-proc` as a process, behind a real Envoy: the command a user runs."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp

from tests.extproc.helpers import usage_chunks
from tests.support import require_tool, wait_until
from tooling.emulator import EmulatorConfig, SharedGpu, create_emulator_app
from tooling.envoy import (
    ADMIN,
    BASELINE,
    INSTALL,
    LISTENER,
    PICKER,
    POOL_BOOTSTRAP,
    SPECULATIVE,
    chat,
    metric,
    picker_in,
    render,
    run_envoy,
)  # fmt: skip
from tooling.local_stack import MODEL, serve_app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(argv: list[str], cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


async def _up(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def test_the_command_serves_envoy_and_stops_on_sigterm(tmp_path: Path) -> None:
    require_tool("envoy", INSTALL)
    gpu = SharedGpu()
    spec_cfg = EmulatorConfig(mode="speculative", model=MODEL, time_scale=0.05)
    spec_runner, spec_url = await serve_app(create_emulator_app(spec_cfg, gpu))
    base_cfg = EmulatorConfig(mode="baseline", model=MODEL, time_scale=0.05)
    base_runner, base_url = await serve_app(create_emulator_app(base_cfg, gpu))
    grpc_port, http_port = _free_port(), _free_port()
    process = _spawn(
        [sys.executable, "-m", "gateway.cli", "ext-proc", "--backend", f"speculative={spec_url}",
         "--backend", f"baseline={base_url}", "--host", "127.0.0.1", "--port", str(grpc_port),
         "--metrics-port", str(http_port)],
        tmp_path,
    )  # fmt: skip
    try:
        metrics = f"http://127.0.0.1:{http_port}"
        await wait_until(lambda: _up(f"{metrics}/ready"), "the picker ready", timeout_s=20)
        ports = {SPECULATIVE: int(spec_url.rsplit(":", 1)[1]),
                 BASELINE: int(base_url.rsplit(":", 1)[1]), PICKER: grpc_port,
                 LISTENER: 0, ADMIN: 0}  # fmt: skip
        config = render(POOL_BOOTSTRAP, ports, tmp_path / "envoy.json")
        async with run_envoy(config, tmp_path) as envoy, aiohttp.ClientSession() as s:
            await picker_in(envoy.admin)
            body = chat(stream=True)
            async with s.post(f"{envoy.url}/v1/chat/completions", json=body) as r:
                assert r.status == 200
                assert r.headers["x-specroute-route"] in ("speculative", "baseline")
                assert r.headers["x-specroute-reason"]
                assert usage_chunks(await r.text()) == []
            assert await metric(metrics, "specroute_requests_total", status="2xx") == 1
            async with s.get(f"{metrics}/v1/models") as r:
                assert r.status == 404  # the metrics port forwards nothing
        process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(process.wait, 20)
        _out, err = process.communicate()
        assert code == 0, err.decode()
        assert b"specroute ext-proc (pool mode) on grpc://127.0.0.1:" in err
        assert b"Traceback" not in err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        await spec_runner.cleanup()
        await base_runner.cleanup()
