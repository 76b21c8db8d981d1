"""`specroute serve | ext-proc | profile | emulate | demo | bench | advise | train`: the CLI.

Only `serve` and `ext-proc` are production code; every other command lives in tooling/ and is
imported only when it runs, so the gateway starts without the bench, the
emulator, scikit-learn or matplotlib. tooling/ is its own distribution,
specroute-tools (tooling/pyproject.toml); without it those commands say how to
get it and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import sys
from pathlib import Path
from typing import Protocol, TypeVar, cast

from classifier.types import Route
from gateway.config import (
    BackendConfig,
    BackendsConfig,
    Config,
    ConfigError,
    SpeculativeBackendConfig,
    check_pairs,
    load_config,
    normalize_backend_url,
)
from gateway.telemetry import configure_logging

_B = TypeVar("_B", bound=BackendConfig)


class _Command(Protocol):
    """What a tooling module offers as a subcommand."""

    def add_arguments(self, p: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace, argv: list[str]) -> int: ...


# name -> (module, help, description): the module is imported only for the command that runs.
_TOOLS = {
    "demo": (
        "tooling.demo",
        "no-GPU demo: EMULATED backends, the gateway, a short mixed workload",
        None,
    ),
    "bench": (
        "tooling.bench.cli",
        "drive a workload at baseline, speculative and gateway side by side; table, JSON, PNG",
        "Drive the same requests at every target and compare them paired: speedup over the "
        "baseline, acceptance, the per-request oracle and the gateway's regret.",
    ),
    "advise": (
        "tooling.advise",
        "from a bench JSON or an outcome log: speculate or not, per workload, and why",
        None,
    ),
    "train": (
        "tooling.train",
        "fit the acceptance model from outcome logs (needs the `train` extra: scikit-learn)",
        None,
    ),
}


def _tooling_missing(command: str, exc: ModuleNotFoundError) -> int:
    """Exit status 2 and how to get tooling, when `exc` is tooling itself not installed
    (specroute-tools); any other missing module (scikit-learn, say) is raised as it is."""
    if exc.name != "tooling" and not (exc.name or "").startswith("tooling."):
        raise exc
    print(
        f"specroute {command}: needs specroute-tools (the tooling package), which is not "
        "installed; from a specroute checkout: pip install ./tooling",
        file=sys.stderr,
    )
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["emulate"]:  # its own parser: every knob of the emulator is a flag
        try:
            from tooling.emulator import main as emulate
        except ModuleNotFoundError as exc:
            return _tooling_missing("emulate", exc)

        return emulate(argv[1:])
    parser = argparse.ArgumentParser(prog="specroute", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    _add_serve_arguments(commands.add_parser("serve", help="run the gateway"))
    profile_cmd = commands.add_parser(
        "profile",
        help="measure both servers' costs now (or --show the stored profile)",
        description="Profile the speculative and the baseline server (they must be idle): "
        "time to first token, the step per batch, acceptance per workload kind, the overlap "
        "on a shared GPU. Writes routing.profile_path (or --out); `serve` reloads it.",
    )
    _add_config_arguments(profile_cmd)
    profile_cmd.add_argument("--out", type=Path, default=None, help="where to write the JSON")
    profile_cmd.add_argument("--show", action="store_true", help="print the stored profile")
    _add_ext_proc_arguments(
        commands.add_parser(
            "ext-proc",
            help="run as Envoy's external processor (gRPC), deciding what Envoy forwards",
            description="Envoy's ext_proc server (envoy.service.ext_proc.v3) with the gateway's "
            "decisions, learning, metrics, shadow copies and profile: Envoy carries the "
            "requests. pool mode sets x-specroute-route for Envoy's route table; endpoint mode "
            "names the server (the Gateway API Inference Extension's endpoint picker protocol). "
            "docs/envoy.md.",
        )
    )
    commands.add_parser(
        "emulate",
        help="run one EMULATED vLLM server (see `specroute emulate --help`)",
        add_help=False,
    )
    tool: _Command | None = None
    for name, (module, help_text, description) in _TOOLS.items():
        sub = commands.add_parser(name, help=help_text, description=description or help_text)
        if argv[:1] == [name]:
            try:
                tool = cast(_Command, importlib.import_module(module))
            except ModuleNotFoundError as exc:
                return _tooling_missing(name, exc)
            tool.add_arguments(sub)
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "ext-proc":
            return _ext_proc(args)
        if args.command == "profile":
            from gateway.profiling.cli import run_profile

            config = resolve_config(args.config, None, None, args.backend)
            return run_profile(config, args.out, show=args.show)
        if tool is not None:
            return tool.run(args, argv[1:])
    except ConfigError as exc:
        print(f"specroute: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


def _add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", type=Path, default=None, help="config.toml (default: ./config.toml if present)"
    )
    p.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="ROUTE=URL",
        help="speculative=URL or baseline=URL; overrides the config file",
    )


def _add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    _add_config_arguments(serve)
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument(
        "--emulate",
        action="store_true",
        help="start two EMULATED vLLM backends in-process and serve in front of them",
    )


def _add_ext_proc_arguments(p: argparse.ArgumentParser) -> None:
    _add_config_arguments(p)
    p.add_argument("--host", default=None, help="address of both ports (default: server.host)")
    p.add_argument("--port", type=int, default=9002, help="the gRPC port Envoy calls (9002)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=9003,
        help="HTTP port of /metrics, /health, /ready, /stats, /decide (9003)",
    )
    p.add_argument(
        "--mode",
        choices=("pool", "endpoint"),
        default="pool",
        help="pool: set x-specroute-route (Envoy's route table picks the cluster); endpoint: "
        "set x-gateway-destination-endpoint and envoy.lb metadata (an ORIGINAL_DST cluster)",
    )


def _ext_proc(args: argparse.Namespace) -> int:
    try:  # grpcio and protobuf come with the `envoy` extra only
        from gateway.extproc.server import serve as serve_ext_proc
        from gateway.extproc.stream import Mode
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in ("grpc", "grpc_health", "google"):
            raise
        print(
            f"specroute ext-proc: needs grpcio and protobuf ({exc.name} is not installed): "
            "pip install 'specroute[envoy]'",
            file=sys.stderr,
        )
        return 2

    config = resolve_config(args.config, args.host, None, args.backend)
    configure_logging(config.logging.level)
    host = config.server.host
    print(
        f"specroute ext-proc ({args.mode} mode) on grpc://{host}:{args.port}, metrics on "
        f"http://{host}:{args.metrics_port}/metrics "
        f"(speculative={','.join(config.backends.speculative.urls)} "
        f"baseline={','.join(config.backends.baseline.urls)})",
        file=sys.stderr,
        flush=True,
    )
    asyncio.run(
        serve_ext_proc(
            config,
            mode=Mode(args.mode),
            host=host,
            grpc_port=args.port,
            http_port=args.metrics_port,
        )
    )
    return 0


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
                speculative=SpeculativeBackendConfig(urls=(overrides[Route.SPECULATIVE],)),
                baseline=BackendConfig(urls=(overrides[Route.BASELINE],)),
            )
        )
    else:
        raise ConfigError(
            "config: no config file; pass --config, or --backend speculative=URL"
            " and --backend baseline=URL"
        )

    def overridden(backend: _B, route: Route) -> _B:
        url = overrides.get(route)
        return backend if url is None else dataclasses.replace(backend, urls=(url,))

    backends_cfg = dataclasses.replace(
        config.backends,
        speculative=overridden(config.backends.speculative, Route.SPECULATIVE),
        baseline=overridden(config.backends.baseline, Route.BASELINE),
    )
    check_pairs(backends_cfg)  # one URL from the command line against a file's pairs
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
    from gateway.serve import serve

    if args.emulate:
        try:
            from tooling.local_stack import serve_emulated
        except ModuleNotFoundError as exc:
            return _tooling_missing("serve --emulate", exc)

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
