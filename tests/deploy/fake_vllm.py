"""A stand-in for the `vllm` command, for testing deploy/gpu/*.sh without a GPU.

    python fake_vllm.py serve MODEL --port P [vLLM flags...]
    python fake_vllm.py --version

It records its command line and its start and ready times in
$FAKE_VLLM_RECORD_DIR/<port>.json, waits $FAKE_VLLM_STARTUP_S (a model
loading, on purpose), then serves the emulated vLLM server (tooling.emulator:
the same API and /metrics names) on the given port until SIGTERM. An emulator
that does not import fails the start (and so the test). With $FAKE_VLLM_FAIL
set it exits 1 at once, like a server that cannot start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Literal

from aiohttp import web

from tooling.emulator import EmulatorConfig, create_emulator_app


def main() -> int:
    if sys.argv[1:] == ["--version"]:
        print("0.32.0 (fake_vllm for tests)")
        return 0
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--gpu-memory-utilization", type=float, required=True)
    parser.add_argument("--speculative-config")
    parser.add_argument("--per-request-spec-decode-metrics")
    args, _extra = parser.parse_known_args()

    started = time.time()
    if os.environ.get("FAKE_VLLM_FAIL"):
        print("fake_vllm: CUDA out of memory (on purpose)", file=sys.stderr)
        return 1
    time.sleep(float(os.environ.get("FAKE_VLLM_STARTUP_S", "0")))  # loading a model, on purpose
    record = {
        "argv": sys.argv[1:],
        "env": {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "HF_", "CUDA_"))},
        "started": started,
        "ready": time.time(),
    }
    record_dir = Path(os.environ["FAKE_VLLM_RECORD_DIR"])
    (record_dir / f"{args.port}.json").write_text(json.dumps(record))

    mode: Literal["speculative", "baseline"] = (
        "speculative" if args.speculative_config else "baseline"
    )
    app = create_emulator_app(
        EmulatorConfig(mode=mode, model=args.served_model_name, time_scale=0.01)
    )
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
