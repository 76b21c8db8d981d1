"""Print the installed vLLM's HTTP route table as JSON: [[kind, path, [methods]], ...].

Run by the vllm venv's python (tests/vllm/test_route_table_real_vllm.py); imports
vLLM only, starts no engine. It builds the app as `vllm serve` does (build_app)
with every optional family on: development mode, runtime LoRA updates, the
profiler, the tokenizer-info endpoint, fault tolerance, every task. The pooling
routers need a model config to register themselves, so they are added directly.
"""

from __future__ import annotations

import json
import os
import sys
import typing
import warnings

os.environ["VLLM_SERVER_DEV_MODE"] = "1"
os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
os.environ["VLLM_ENABLE_COHERE_API"] = "1"  # registered only if its SDK is installed
warnings.simplefilter("ignore")

from vllm.config import ProfilerConfig  # noqa: E402
from vllm.entrypoints.launchers.app import build_app  # noqa: E402
from vllm.entrypoints.launchers.cli_args import make_arg_parser  # noqa: E402
from vllm.entrypoints.pooling.classify.api_router import router as classify  # noqa: E402
from vllm.entrypoints.pooling.embed.api_router import router as embed  # noqa: E402
from vllm.entrypoints.pooling.pooling.api_router import router as pooling  # noqa: E402
from vllm.entrypoints.pooling.scoring.api_router import router as scoring  # noqa: E402
from vllm.tasks import SupportedTask  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402


def _flat(kind: object) -> list[str]:
    out: list[str] = []
    for arg in typing.get_args(kind):
        out += _flat(arg) if typing.get_args(arg) else [arg]
    return out


def main() -> None:
    args = make_arg_parser(FlexibleArgumentParser()).parse_args([])
    args.enable_fault_tolerance = True
    args.enable_tokenizer_info_endpoint = True
    args.profiler_config = ProfilerConfig(profiler="torch", torch_profiler_dir="/nonexistent")
    app = build_app(args, tuple(_flat(SupportedTask)), None)
    for router in (pooling, classify, embed, scoring):
        app.include_router(router)
    rows = [
        [type(r).__name__, r.path, sorted(getattr(r, "methods", None) or [])] for r in app.routes
    ]
    json.dump(rows, sys.stdout)


if __name__ == "__main__":
    main()
