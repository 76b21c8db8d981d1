"""`specroute serve | emulate | demo | bench | advise | train`: the command line."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from pathlib import Path

from classifier.policy import Route
from gateway.advise import add_arguments as add_advise_arguments
from gateway.bench.cli import add_arguments as add_bench_arguments
from gateway.config import (
    BackendConfig,
    BackendsConfig,
    Config,
    ConfigError,
    load_config,
    normalize_backend_url,
)
from gateway.telemetry import configure_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specroute", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument(
        "--config", type=Path, default=None, help="config.toml (default: ./config.toml if present)"
    )
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="ROUTE=URL",
        help="speculative=URL or baseline=URL; overrides the config file",
    )
    serve.add_argument(
        "--emulate",
        action="store_true",
        help="start two EMULATED vLLM backends in-process and serve in front of them",
    )
    demo = commands.add_parser(
        "demo", help="no-GPU demo: EMULATED backends, the gateway, a short mixed workload"
    )
    demo.add_argument("--requests", type=int, default=6, help="requests per workload and target")
    demo.add_argument("--concurrency", type=int, default=2)
    demo.add_argument("--time-scale", type=float, default=0.5, help="emulator time scale")

    bench = commands.add_parser(
        "bench",
        help="drive a workload at baseline, speculative and gateway side by side; table, JSON, PNG",
        description="Drive the same requests at every target and compare them paired: "
        "speedup over the baseline, acceptance, the per-request oracle and the gateway's regret.",
    )
    add_bench_arguments(bench)
    advise = commands.add_parser(
        "advise",
        help="from a bench JSON or an outcome log: speculate or not, per workload, and why",
    )
    add_advise_arguments(advise)

    commands.add_parser(
        "emulate",
        help="run one EMULATED vLLM server (see `specroute emulate --help`)",
        add_help=False,
    )

    train = commands.add_parser("train", help="fit the acceptance model from outcome logs")
    train.add_argument("outcomes", type=Path, nargs="+", help="outcome log JSONL file(s)")
    train.add_argument("--out", type=Path, required=True, help="model file to write (JSON)")
    train.add_argument(
        "--num-speculative-tokens", type=int, default=4, help="k of the speculative server"
    )

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["emulate"]:  # its own parser: every knob of the emulator is a flag
        from gateway.emulator import main as emulate

        return emulate(argv[1:])
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from gateway.demo import run_demo

            configure_logging("warning")
            return asyncio.run(
                run_demo(
                    per_workload=args.requests,
                    concurrency=args.concurrency,
                    time_scale=args.time_scale,
                )
            )
        if args.command == "serve":
            return _serve(args)
        if args.command == "bench":
            from gateway.bench.cli import main as bench_main

            configure_logging("warning")
            return bench_main(args, argv[1:])
        if args.command == "advise":
            from gateway.advise import main as advise_main

            return advise_main(args)
        if args.command == "train":
            from gateway.train import run

            return run(args.outcomes, args.out, args.num_speculative_tokens)
    except ConfigError as exc:
        print(f"specroute: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


def resolve_config(
    path: Path | None, host: str | None, port: int | None, backends: list[str]
) -> Config:
    """The config file, then the command-line overrides on top of it."""
    overrides = _parse_backends(backends)
    if path is None and Path("config.toml").exists():
        path = Path("config.toml")
    if path is not None:
        config = load_config(path)
    elif set(overrides) == set(Route):
        config = Config(
            backends=BackendsConfig(
                speculative=BackendConfig(urls=(overrides[Route.SPECULATIVE],)),
                baseline=BackendConfig(urls=(overrides[Route.BASELINE],)),
            )
        )
    else:
        raise ConfigError(
            "config: no config file; pass --config, or --backend speculative=URL"
            " and --backend baseline=URL"
        )
    backends_cfg = config.backends
    for route, url in overrides.items():
        backends_cfg = dataclasses.replace(
            backends_cfg, **{route.value: dataclasses.replace(backends_cfg.of(route), urls=(url,))}
        )
    server = dataclasses.replace(
        config.server,
        host=host if host is not None else config.server.host,
        port=port if port is not None else config.server.port,
    )
    return dataclasses.replace(config, backends=backends_cfg, server=server)


def _parse_backends(items: list[str]) -> dict[Route, str]:
    parsed: dict[Route, str] = {}
    for item in items:
        name, sep, url = item.partition("=")
        try:
            route = Route(name.strip())
        except ValueError:
            raise ConfigError(
                f"--backend {item!r}: route must be speculative or baseline"
            ) from None
        if not sep:
            raise ConfigError(f"--backend {item!r}: expected ROUTE=URL")
        parsed[route] = normalize_backend_url(url.strip(), f"--backend {name}")
    return parsed


def _serve(args: argparse.Namespace) -> int:
    from gateway.serve import serve, serve_emulated

    if args.emulate:
        configure_logging("info")
        asyncio.run(serve_emulated(args.host or "127.0.0.1", args.port or 8080, time_scale=1.0))
        return 0
    config_path = args.config
    if config_path is None and Path("config.toml").exists():
        config_path = Path("config.toml")

    def reread() -> Config:
        return resolve_config(config_path, args.host, args.port, args.backend)

    config = reread()
    configure_logging(config.logging.level)
    print(
        f"specroute gateway on http://{config.server.host}:{config.server.port}/v1 "
        f"(speculative={','.join(config.backends.speculative.urls)} "
        f"baseline={','.join(config.backends.baseline.urls)})",
        file=sys.stderr,
        flush=True,
    )
    asyncio.run(serve(config, reread if config_path is not None else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
