"""Decisions per second one picker process makes: `specroute ext-proc`'s per-request work
(request headers, then the body: parse, features, decide, the include_usage mutation,
then the stream's end: release, record, metrics, log line, learning), in-process,
without Envoy or gRPC. The backends are never contacted.

    flock /tmp/specroute-cpu.lock .venv/bin/python benchmarks/extproc_decisions.py [--n 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.app import create_app  # noqa: E402
from gateway.cli import resolve_config  # noqa: E402
from gateway.extproc.pb import ext_proc_subset_pb2 as pb  # noqa: E402
from gateway.extproc.stream import Mode, PickerStream  # noqa: E402
from gateway.telemetry import configure_logging  # noqa: E402


def _messages(stream: bool) -> tuple[pb.ProcessingRequest, pb.ProcessingRequest]:
    body = {"model": "m", "messages": [{"role": "user", "content": "SQL: top 5 users"}],
            "max_tokens": 64, "stream": stream}  # fmt: skip
    raw = json.dumps(body).encode()
    headers = [(":method", "POST"), (":path", "/v1/chat/completions"),
               ("content-type", "application/json"), ("content-length", str(len(raw)))]  # fmt: skip
    first = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=pb.HeaderMap(
                headers=[pb.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers]
            )
        )
    )
    second = pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=True))
    return first, second


async def main(n: int) -> float:
    config = resolve_config(
        None, None, None, ["speculative=http://127.0.0.1:9", "baseline=http://127.0.0.1:9"]
    )
    app = create_app(config, forward=False)
    messages = [_messages(False), _messages(True)]
    started = time.perf_counter()
    for i in range(n):
        stream = PickerStream(app, Mode.POOL)
        headers, body = messages[i % 2]
        await stream.on(headers)
        await stream.on(body)
        stream.close()  # as a reset stream ends: released, recorded, logged
    return n / (time.perf_counter() - started)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20000)
    args = parser.parse_args()
    configure_logging("warning")
    logging.disable(logging.INFO)
    rate = asyncio.run(main(args.n))
    print(f"{args.n} decisions, {rate:.0f} decisions/s (one process, one core)")
