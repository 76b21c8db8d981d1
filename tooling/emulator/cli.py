"""`specroute emulate`: run one emulated vLLM server until interrupted (registered as
the command by tooling/emulate.py)."""

from __future__ import annotations

import argparse
import sys

from aiohttp import web

from gateway.commands import Help

from .app import create_emulator_app
from .config import EmulatorConfig, add_emulator_arguments, config_from_args
from .costs import describe_gpu
from .dynamic import to_json

HELP = Help(
    "run one EMULATED vLLM server: vLLM's API and /metrics, modelled GPU timing",
    "An EMULATED vLLM OpenAI server: vLLM's API and /metrics, modelled timing (no model "
    "runs: text is modelled, step times from a measured GPU profile).",
    (
        "specroute emulate --mode speculative --port 8001",
        "specroute emulate --mode baseline --port 8002 --gpu-profile h200-qwen3-32b",
        "specroute emulate --mode dynamic --num-speculative-tokens-per-batch-size "
        "'[[1,4,4],[5,256,0]]'",
    ),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`specroute emulate`'s flags: one per EmulatorConfig field, each with its default."""
    add_emulator_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    """`specroute emulate` on its own (tooling.emulator.main)."""
    parser = argparse.ArgumentParser(prog="specroute emulate", **HELP.options())
    add_arguments(parser)
    return parser


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """Say loudly that this is an emulation, serve until Ctrl-C."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"specroute emulate: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"specroute emulate: EMULATED vLLM server, mode={config.mode}, model={config.model}, "
        f"time_scale={config.time_scale}, on http://{args.host}:{args.port} "
        f"(no model runs here: text is modelled, timing from the {describe_gpu(config)})",
        flush=True,
    )
    if config.mode == "dynamic":
        print(f"[EMULATED] {describe_dynamic(config)}", flush=True)
    # run_app leaves handler cancellation off; vLLM aborts a request whose client
    # went away, and so does the emulator, which needs the handler cancelled.
    web.run_app(
        create_emulator_app(config),
        host=args.host,
        port=args.port,
        handler_cancellation=True,
        print=lambda line: print(f"[EMULATED] {line}", flush=True),
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """`specroute emulate` without the rest of the CLI: parse, then run."""
    return run(build_parser().parse_args(argv), [] if argv is None else argv)


def describe_dynamic(config: EmulatorConfig) -> str:
    """One line: the schedule as given to vLLM, and the K it gives at a few batch sizes."""
    schedule = config.num_speculative_tokens_per_batch_size or ()
    lookup = config.k_by_batch_size()
    sizes = [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256) if n < len(lookup)]
    ks = ", ".join(f"{n}:{lookup[n]}" for n in sizes)
    empty = " (empty: vLLM's scheduler then drafts k every step)" if not schedule else ""
    k0 = " (the draft model still runs one pass)" if config.draft_forward_at_k0 else ""
    return (
        f"dynamic speculative decoding: num_speculative_tokens_per_batch_size="
        f"{to_json(schedule)}{empty}, k<={config.num_speculative_tokens}; "
        f"K by batch size {ks}; a K=0 step proposes no drafts{k0}"
    )
