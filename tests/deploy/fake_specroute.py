"""`specroute` for testing deploy/gpu/validate.sh: the real command, except `bench`.

`specroute bench` does not exist yet; this one takes the interface
validate.sh is written against, checks every target answers
/v1/models, sends one chat request through each, and writes the JSON and a
1x1 PNG where asked. Every other subcommand runs the real specroute.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from pathlib import Path

PNG_1X1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)


def bench(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="specroute bench")
    p.add_argument("--target", action="append", required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--concurrency", required=True)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--plot", type=Path, required=True)
    args = p.parse_args(argv)
    results = {}
    for target in args.target:
        name, _, url = target.partition("=")
        with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as resp:
            model = json.load(resp)["data"][0]["id"]
        body = json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        ).encode()
        req = urllib.request.Request(
            f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            answer = json.load(resp)
            route = resp.headers.get("x-specroute-route")
        results[name] = {"url": url, "model": model, "usage": answer["usage"], "route": route}
    args.json.write_text(
        json.dumps(
            {
                "fake": True,
                "workload": args.workload,
                "concurrency": [int(c) for c in args.concurrency.split(",")],
                "targets": results,
            }
        )
    )
    args.plot.write_bytes(PNG_1X1)
    print("fake bench: done")
    return 0


def main() -> int:
    if sys.argv[1:2] == ["bench"]:
        return bench(sys.argv[2:])
    real = Path(sys.executable).with_name("specroute")
    os.execv(real, [str(real), *sys.argv[1:]])
    return 1  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
