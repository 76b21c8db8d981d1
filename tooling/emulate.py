"""`specroute emulate` as tooling/pyproject.toml registers it: one EMULATED vLLM server
(tooling/emulator/cli.py), and what the command adds to `specroute serve --emulate`, the
gateway in front of emulated servers (gateway/commands.py's ServesEmulated).

It lives outside tooling/emulator/ because the stacks it starts import the emulator;
they are imported when `serve --emulate` runs, so `specroute emulate` loads no gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from tooling.emulator.cli import HELP, add_arguments, run
from tooling.emulator.config import add_gpu_arguments

if TYPE_CHECKING:
    from gateway.config import Config

__all__ = ["HELP", "add_arguments", "add_serve_arguments", "run", "serve_emulated"]


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """`serve --emulate`'s own flags: the GPU the emulated servers model, their drafter."""
    add_gpu_arguments(p)


def serve_emulated(args: argparse.Namespace, config: Config | None) -> int:
    """`serve --emulate`, until Ctrl-C: the config's routes each on emulated servers
    (tooling/configured_stack.py), else the speculative/baseline pair
    (tooling/local_stack.py). The flags are read with getattr: an abbreviated --emulate
    is seen only after the parse, without them."""
    from gateway.config import ConfigError
    from tooling.configured_stack import serve_configured
    from tooling.local_stack import serve_emulated as serve_pair

    gpu = {"gpu_profile": args.gpu_profile} if getattr(args, "gpu_profile", "") else {}
    drafter = getattr(args, "drafter", "")
    if config is not None:
        if drafter:
            raise ConfigError("--drafter: with --config each route's method names its drafter")
        server = config.server
        asyncio.run(serve_configured(config, server.host, server.port, **gpu))
        return 0
    try:
        host, port = args.host or "127.0.0.1", args.port or 8080
        asyncio.run(serve_pair(host, port, time_scale=1.0, drafter=drafter, **gpu))
    except ValueError as exc:  # a GPU profile or drafter the emulator refuses
        print(f"specroute serve --emulate: {exc}", file=sys.stderr)
        return 2
    return 0
