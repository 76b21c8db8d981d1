"""EmulatorConfig validation, its CLI flags, and `main()` serving for real."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys

import aiohttp
import pytest

from tests.support import wait_until
from tooling.emulator import EmulatorConfig, add_emulator_arguments, config_from_args


def _parse(*argv: str) -> tuple[argparse.Namespace, EmulatorConfig]:
    parser = argparse.ArgumentParser()
    add_emulator_arguments(parser)
    ns = parser.parse_args(list(argv))
    return ns, config_from_args(ns)


def test_flags_cover_every_knob() -> None:
    ns, config = _parse(
        "--mode", "speculative", "--port", "9001", "--model", "m", "--seed", "7",
        "--time-scale", "0.5", "--num-speculative-tokens", "3",
        "--per-request-spec-decode-metrics", "detailed", "--no-count-client-aborts",
        "--fail-status", "503", "--refuse-connections",
    )  # fmt: skip
    assert (ns.host, ns.port) == ("127.0.0.1", 9001)
    assert config == EmulatorConfig(
        mode="speculative",
        model="m",
        seed=7,
        time_scale=0.5,
        num_speculative_tokens=3,
        per_request_spec_decode_metrics="detailed",
        count_client_aborts=False,
        fail_status=503,
        refuse_connections=True,
    )
    assert _parse("--mode", "baseline")[1] == EmulatorConfig(mode="baseline")


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"mode": "turbo"}, "mode must be one of"),
        ({"time_scale": 0}, "time_scale"),
        ({"acceptance_chat": 1.5}, "acceptance_chat"),
        ({"kv_cache_tokens": 100}, "kv_cache_tokens"),
        ({"fail_status": 200}, "fail_status"),
        ({"text_min_tokens": 10, "text_max_tokens": 5}, "text_min_tokens"),
    ],
)
def test_invalid_config_is_refused(knobs: dict[str, object], message: str) -> None:
    knobs.setdefault("mode", "baseline")
    with pytest.raises(ValueError, match=message):
        EmulatorConfig(**knobs)  # type: ignore[arg-type]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_main_serves_and_says_emulated() -> None:
    """`specroute emulate` as a process: it prints EMULATED, then answers like vLLM."""
    port = _free_port()
    code = "import sys; from tooling.emulator import main; sys.exit(main(sys.argv[1:]))"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, "--mode", "baseline", "--port", str(port), "--time-scale", "0.1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        cwd=os.getcwd(),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert b"EMULATED vLLM server" in first and b"mode=baseline" in first
        async with aiohttp.ClientSession() as session:

            async def healthy() -> bool:
                async with session.get(f"http://127.0.0.1:{port}/health") as resp:
                    return resp.status == 200

            await wait_until(
                healthy, "/health to answer 200", ignoring=(aiohttp.ClientConnectionError,)
            )
            body = {"prompt": "hi", "max_tokens": 3}
            async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as resp:
                assert (await resp.json())["usage"]["completion_tokens"] == 3
    finally:
        proc.terminate()
        await proc.wait()
