"""`specroute emulate`: run one emulated vLLM server until interrupted."""

from __future__ import annotations

import argparse

from aiohttp import web

from .app import create_emulator_app
from .config import add_emulator_arguments, config_from_args


def main(argv: list[str] | None = None) -> int:
    """Parse flags, say loudly that this is an emulation, serve until Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="specroute emulate",
        description="An EMULATED vLLM OpenAI server: vLLM's API and /metrics, modelled timing.",
    )
    add_emulator_arguments(parser)
    ns = parser.parse_args(argv)
    try:
        config = config_from_args(ns)
    except ValueError as exc:
        parser.error(str(exc))
    print(
        f"specroute emulate: EMULATED vLLM server, mode={config.mode}, model={config.model}, "
        f"time_scale={config.time_scale}, on http://{ns.host}:{ns.port} "
        "(no model runs here: text and timing are modelled)",
        flush=True,
    )
    # run_app leaves handler cancellation off; vLLM aborts a request whose client
    # went away, and so does the emulator, which needs the handler cancelled.
    web.run_app(
        create_emulator_app(config),
        host=ns.host,
        port=ns.port,
        handler_cancellation=True,
        print=lambda line: print(f"[EMULATED] {line}", flush=True),
    )
    return 0
