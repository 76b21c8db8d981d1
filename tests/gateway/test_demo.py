"""The README's main job, end to end: `specroute demo` and `specroute serve --emulate`."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[2]


async def test_demo_runs_end_to_end_and_says_emulated() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        "demo",
        "--requests",
        "3",
        "--time-scale",
        "0.25",
        "--warmup",
        "2",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=110)
    text = out.decode()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert text.startswith("specroute demo: EMULATED backends")
    for workload in ("structured", "sql", "code", "creative", "rag"):
        assert f"\n{workload} " in text
    assert "gateway/oracle" in text and "0 failed" in text
    # The warm-up prints what the gateway learned, per workload it saw.
    learned = text.split("what it learned:", 1)[1].split("\n\n", 1)[0]
    assert "believed" in learned and "\n  creative " in learned
    assert "EMULATED" in err.decode()


async def test_serve_emulate_answers_the_sdk(unused_tcp_port: int) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "--emulate",
        "--port",
        str(unused_tcp_port),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        banner = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert "EMULATED" in banner
        async with openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{unused_tcp_port}/v1", api_key="x", max_retries=0
        ) as client:
            reply = await client.chat.completions.with_raw_response.create(
                model="emulated-model",
                messages=[{"role": "user", "content": "Give me JSON"}],
                response_format={"type": "json_object"},
                temperature=0,
                max_tokens=20,
            )
            assert reply.headers["x-specroute-route"] in ("speculative", "baseline")
            assert reply.parse().choices[0].message.content
    finally:
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
