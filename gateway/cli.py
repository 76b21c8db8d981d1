"""`specroute serve | ext-proc | profile | config`, and the commands installed beside them.

Only `serve`, `ext-proc`, `profile` and `config` are the gateway's. Every other command
(emulate, demo, bench, advise, train, gpu from specroute-tools) is registered in the
entry-point group `specroute.commands` (gateway/commands.py) and imported only when it
runs, so the gateway starts without the bench, the emulator, scikit-learn or matplotlib;
with none installed, a command not the gateway's says in one line what to install.

Every command has a description and examples in its --help, and every flag its help
and default. The production commands' main flags fall back to environment variables
(ENVIRONMENT below): a flag beats its variable, which beats config.toml.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.metadata
import json
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from classifier.types import PAIR, ROUTE_NAME, Route
from gateway import commands
from gateway.addresses import is_host, parse_port, redact_url
from gateway.commands import Command, Help, HelpFormatter, ServesEmulated
from gateway.config import (
    Config,
    ConfigError,
    LoggingConfig,
    check_routes,
    config_warnings,
    json_schema,
    load_config,
    normalize_backend_url,
    parse_config,
)
from gateway.telemetry import configure_logging

DESCRIPTION = (
    "An OpenAI-compatible gateway that sends each request to a vLLM server with or without "
    "speculative decoding, whichever is predicted faster for it now."
)

# flag dest -> the environment variable it falls back to
ENVIRONMENT = {
    "config": "SPECROUTE_CONFIG",
    "host": "SPECROUTE_HOST",
    "port": "SPECROUTE_PORT",
    "metrics_port": "SPECROUTE_METRICS_PORT",
    "log_level": "SPECROUTE_LOG_LEVEL",
}
_LEVELS = ("debug", "info", "warning", "error")
_EXT_PROC_PORTS = {"port": 9002, "metrics_port": 9003}
_GET_TOOLS = "from a specroute checkout: pip install ./tooling"
Plugins = Mapping[str, importlib.metadata.EntryPoint]  # the installed commands, by name

_COMMANDS = {
    "serve": Help(
        "run the gateway",
        "Run the OpenAI-compatible gateway: each request goes to the speculative or the "
        "baseline vLLM server, whichever is predicted faster for it now (docs/ARCHITECTURE.md). "
        "SIGHUP re-reads the config file; SIGTERM drains.",
        (
            "specroute serve                                  # ./config.toml",
            "specroute serve --config /etc/specroute/config.toml --host 0.0.0.0",
            "specroute serve --backend speculative=http://gpu:8001 "
            "--backend baseline=http://gpu:8002",
            "specroute serve --emulate --config routes.toml   # no GPU: its routes EMULATED",
        ),
    ),
    "ext-proc": Help(
        "run as Envoy's external processor (gRPC), deciding what Envoy forwards",
        "Envoy's ext_proc server (envoy.service.ext_proc.v3) with the gateway's decisions, "
        "learning, metrics, shadow copies and profile: Envoy carries the requests. pool mode "
        "sets x-specroute-route for Envoy's route table; endpoint mode names the server (the "
        "Gateway API Inference Extension's endpoint picker protocol). docs/envoy.md.",
        (
            "specroute ext-proc --config config.toml",
            "specroute ext-proc --mode endpoint --host 0.0.0.0 --port 9002",
        ),
    ),
    "profile": Help(
        "measure both servers' costs now (or --show the stored profile)",
        "Profile the speculative and the baseline server (they must be idle): time to first "
        "token, the step per batch, acceptance per workload kind, the overlap on a shared GPU. "
        "Writes routing.profile_path (or --out); `serve` reloads it.",
        (
            "specroute profile --config config.toml --out profile.json",
            "specroute profile --show",
        ),
    ),
    "config": Help(
        "print the config's JSON Schema, or check a config file",
        "--schema prints config.toml's JSON Schema (draft 2020-12: every key, its type, "
        "default, choices and description), for an editor's completion and checks. --check "
        "reads a config file as `serve` would and lists every problem in it (exit 2).",
        (
            "specroute config --schema > specroute.schema.json",
            "specroute config --check /etc/specroute/config.toml",
        ),
    ),
}


def version() -> str:
    """The installed distribution's version."""
    try:
        return importlib.metadata.version("specroute")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def environment(dests: tuple[str, ...]) -> str:
    """--help's list of the environment variables a command reads (its flags' dests)."""
    text = "environment (a flag beats its variable, which beats config.toml):\n"
    return text + "\n".join(f"  {ENVIRONMENT[d]:<24}--{d.replace('_', '-')}" for d in dests)


def installed() -> dict[str, importlib.metadata.EntryPoint]:
    """The commands installed beside the gateway's (a plugin's name that is one of the
    gateway's own is passed over)."""
    return {n: e for n, e in commands.installed().items() if n not in _COMMANDS}


def _needs_tools(command: str) -> int:
    print(
        f"specroute {command}: needs specroute-tools (the tooling package), which is not "
        f"installed; {_GET_TOOLS}",
        file=sys.stderr,
    )
    return 2


def _tooling_missing(command: str, exc: ModuleNotFoundError) -> int:
    """Exit status 2 and how to get tooling, when `exc` is tooling itself not importable
    (its entry points installed, its package gone); any other missing module
    (scikit-learn, say) is raised as it is."""
    if (exc.name or "").split(".")[0] != "tooling":
        raise exc
    return _needs_tools(command)


def _load(name: str, label: str, plugins: Plugins) -> Command | None:
    """The installed command `name`, imported; None, and why on stderr, where it is not
    installed or its package cannot be imported."""
    entry = plugins.get(name)
    if entry is None:
        _needs_tools(label)
        return None
    try:
        return commands.load(entry)
    except ModuleNotFoundError as exc:
        _tooling_missing(label, exc)
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    name = argv[0] if argv else ""
    plugins = installed()  # read once: each read scans every distribution's metadata
    tools: dict[str, Command] = {}
    if name in plugins or (name == "serve" and "--emulate" in argv[1:]):
        wanted = "emulate" if name == "serve" else name  # serve --emulate: its flags too
        tool = _load(wanted, "serve --emulate" if name == "serve" else name, plugins)
        if tool is None:
            return 2
        tools[wanted] = tool
    elif name and name[0] != "-" and name not in _COMMANDS and not plugins:
        print(
            f"specroute {name}: not a command of the gateway ({', '.join(_COMMANDS)}), and "
            f"no other commands are installed; the tools' come with specroute-tools, {_GET_TOOLS}",
            file=sys.stderr,
        )
        return 2
    parser = build_parser(tools, plugins)
    args = parser.parse_args(argv)
    try:
        apply_environment(args)
        if args.command == "serve":
            return _serve(args, tools, plugins)
        if args.command == "ext-proc":
            return _ext_proc(args)
        if args.command == "profile":
            from gateway.profiling.cli import run_profile

            config = resolve_config(_config_path(args.config), None, None, args.backend)
            return run_profile(config, args.out, show=args.show)
        if args.command == "config":
            return _config(args)
        if args.command in tools:
            return tools[args.command].run(args, argv[1:])
    except ConfigError as exc:
        print(f"specroute: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


def build_parser(
    tools: Mapping[str, Command], plugins: Plugins | None = None
) -> argparse.ArgumentParser:
    """The CLI's parser, with the flags of the installed commands in `tools` (the others
    of `plugins`, default installed(), are listed by name and distribution, their flags
    unknown: their modules are not imported, not even for `specroute --help`)."""
    plugins = installed() if plugins is None else plugins
    none = () if plugins else (f"other commands: none installed ({_GET_TOOLS})",)
    parser = argparse.ArgumentParser(
        prog="specroute",
        description=commands.wrap(DESCRIPTION),
        epilog=commands.epilog(
            (
                "specroute serve --emulate        # try it without a GPU",
                "specroute serve --config config.toml",
                "specroute COMMAND --help",
            ),
            *none,
            f"specroute {version()}",
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"specroute {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, *dests: str) -> argparse.ArgumentParser:
        spec = _COMMANDS[name]
        sections = (environment(dests),) if dests else ()
        return subparsers.add_parser(name, help=spec.summary, **spec.options(*sections))

    serve = add("serve", "config", "host", "port", "log_level")
    serve.epilog = f"{serve.epilog}\n\nspecroute {version()}"
    _add_serve_arguments(serve)
    _add_ext_proc_arguments(add("ext-proc", "config", "host", "port", "metrics_port", "log_level"))
    _add_profile_arguments(add("profile", "config"))
    _add_config_command_arguments(add("config"))
    for name, entry in plugins.items():
        tool = tools.get(name)
        if tool is None:
            dist = entry.dist.name if entry.dist else entry.value  # listed, not imported
            subparsers.add_parser(name, help=f"from {dist}")
            continue
        tool.add_arguments(
            subparsers.add_parser(name, help=tool.HELP.summary, **tool.HELP.options())
        )
    if hasattr(tools.get("emulate"), "add_serve_arguments"):
        cast(ServesEmulated, tools["emulate"]).add_serve_arguments(serve)
    return parser


def apply_environment(args: argparse.Namespace) -> None:
    """A flag not given takes its variable's value (ENVIRONMENT), where the command has
    the flag; then ext-proc's ports their defaults. Hosts and ports, from either, are
    checked here: one line naming the flag or the variable, not a traceback at bind."""
    for dest, var in ENVIRONMENT.items():
        if not hasattr(args, dest):  # a flag this command does not have
            continue
        flag = getattr(args, dest)
        if dest in ("host", "port", "metrics_port") and isinstance(flag, str):
            setattr(args, dest, _address(dest, flag, f"--{dest.replace('_', '-')}"))
            continue
        value = os.environ.get(var, "")
        if flag is not None or not value:
            continue
        if dest in ("host", "port", "metrics_port"):
            setattr(args, dest, _address(dest, value, var))
        elif dest == "log_level":  # WARNING or warning: the case is not the level
            if value.lower() not in _LEVELS:
                raise ConfigError(f"{var}={value!r}: must be one of {', '.join(_LEVELS)}")
            setattr(args, dest, value.lower())
        else:
            setattr(args, dest, Path(value) if dest == "config" else value)
    if args.command == "ext-proc":
        for dest, port in _EXT_PROC_PORTS.items():
            if getattr(args, dest) is None:
                setattr(args, dest, port)


def _address(dest: str, value: str, source: str) -> str | int:
    """A host or a port as the flag or variable `source` gave it, checked."""
    if dest == "host":
        if not is_host(value):
            raise ConfigError(f"{source}={value!r}: not a host name or IP address")
        return value
    port = parse_port(value)
    if port is None:
        raise ConfigError(f"{source}={value!r}: not a port number (1-65535, ASCII digits)")
    return port


def _config_path(path: Path | None) -> Path | None:
    """--config (or SPECROUTE_CONFIG), else ./config.toml where there is one."""
    if path is None and Path("config.toml").exists():
        return Path("config.toml")
    return path


def _add_config_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="the config file (env: SPECROUTE_CONFIG; default: ./config.toml if present)",
    )
    p.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="ROUTE=URL",
        help="speculative=URL or baseline=URL (repeatable): that route's one server, "
        "instead of the config file's backends.ROUTE.urls",
    )


def _add_log_level_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-level",
        type=str.lower,  # --log-level WARNING as well
        choices=_LEVELS,
        default=None,
        help="instead of logging.level (env: SPECROUTE_LOG_LEVEL; default: the config's, info)",
    )


def _add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    _add_config_arguments(serve)
    serve.add_argument(
        "--host",
        default=None,
        help="address to listen on (env: SPECROUTE_HOST; default: server.host, 127.0.0.1)",
    )
    serve.add_argument(
        "--port",
        default=None,
        help="port to listen on (env: SPECROUTE_PORT; default: server.port, 8080)",
    )
    _add_log_level_argument(serve)
    serve.add_argument(
        "--emulate",
        action="store_true",
        help="serve in front of EMULATED vLLM backends started in-process, by the installed "
        "`emulate` command (specroute-tools): the --config file's routes, else the "
        "speculative/baseline pair; `specroute serve --emulate --help` shows its flags",
    )


def _add_profile_arguments(p: argparse.ArgumentParser) -> None:
    _add_config_arguments(p)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="where to write the JSON (default: routing.profile_path, else stdout)",
    )
    p.add_argument("--show", action="store_true", help="print the stored profile")


def _add_config_command_arguments(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--schema", action="store_true", help="print the JSON Schema of config.toml")
    what.add_argument(
        "--check",
        nargs="?",
        const="",
        metavar="FILE",
        help="check FILE and list every problem in it; exit 2 if any (default: "
        "SPECROUTE_CONFIG, else ./config.toml)",
    )
    p.set_defaults(config=None)  # --check alone: SPECROUTE_CONFIG, as serve would read


def _add_ext_proc_arguments(p: argparse.ArgumentParser) -> None:
    _add_config_arguments(p)
    p.add_argument(
        "--host",
        default=None,
        help="address of both ports (env: SPECROUTE_HOST; default: server.host, 127.0.0.1)",
    )
    p.add_argument(
        "--port",
        default=None,
        help="the gRPC port Envoy calls (env: SPECROUTE_PORT; default: 9002)",
    )
    p.add_argument(
        "--metrics-port",
        default=None,
        metavar="PORT",
        help="HTTP port of /metrics, /health, /ready, /stats, /decide "
        "(env: SPECROUTE_METRICS_PORT; default: 9003)",
    )
    _add_log_level_argument(p)
    p.add_argument(
        "--mode",
        choices=("pool", "endpoint"),
        default="pool",
        help="pool: set x-specroute-route (Envoy's route table picks the cluster); endpoint: "
        "set x-gateway-destination-endpoint and envoy.lb metadata (an ORIGINAL_DST cluster)",
    )


def _config(args: argparse.Namespace) -> int:
    if args.schema:
        print(json.dumps(json_schema(), indent=2))
        return 0
    path = Path(args.check) if args.check else _config_path(args.config)
    if path is None:
        raise ConfigError("config: no file to check: give --check FILE, or set SPECROUTE_CONFIG")
    _warn(load_config(path))  # raises, with every problem
    print(f"{path}: ok")
    return 0


def _warn(config: Config) -> None:
    for warning in config_warnings(config):
        print(f"specroute: warning: {warning}", file=sys.stderr, flush=True)


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

    config = resolve_config(
        _config_path(args.config), args.host, None, args.backend, log_level=args.log_level
    )
    configure_logging(config.logging.level)
    _warn(config)
    host = config.server.host
    _check_listen(host, args.port, args.metrics_port)
    shown = _url_host(host)
    print(
        f"specroute ext-proc ({args.mode} mode) on grpc://{shown}:{args.port}, metrics on "
        f"http://{shown}:{args.metrics_port}/metrics "
        f"({_routes_line(config)})",
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
    path: Path | None,
    host: str | None,
    port: int | None,
    backends: list[str],
    *,
    log_level: str | None = None,
) -> Config:
    """The config file, then the command-line overrides (flags or their variables) on top."""
    overrides = _parse_backends(backends)
    path = _config_path(path)
    if path is not None:
        config = load_config(path)
    elif set(overrides) == set(PAIR):
        config = parse_config({"backends": {r.value: {"urls": [overrides[r]]} for r in PAIR}})
    else:
        raise ConfigError(
            "config: no config file; pass --config, or --backend speculative=URL"
            " and --backend baseline=URL"
        )
    unknown = [r.value for r in overrides if r not in config.routes]
    if unknown:
        names = ", ".join(r.value for r in config.routes)
        raise ConfigError(f"config: --backend {', '.join(unknown)}: not a route ({names})")
    routes = {
        route: c if route not in overrides else dataclasses.replace(c, urls=(overrides[route],))
        for route, c in config.routes.items()
    }
    config = dataclasses.replace(config, routes=routes)
    check_routes(config)  # one URL from the command line against a file's groups
    server = dataclasses.replace(
        config.server,
        host=host if host is not None else config.server.host,
        port=port if port is not None else config.server.port,
    )
    logging = config.logging if log_level is None else LoggingConfig(level=log_level)
    return dataclasses.replace(config, server=server, logging=logging)


def _routes_line(config: Config) -> str:
    """`none=http://...:8002 ngram-k4=http://...:8001`: the routes as the banner shows them,
    without credentials (a banner ends up in logs)."""
    return " ".join(
        f"{r.value}={','.join(redact_url(u) for u in c.urls)}" for r, c in config.routes.items()
    )


def _check_listen(host: str, *ports: int) -> None:
    """A listen address that does not resolve: one line now, not a traceback at bind."""
    for port in ports:
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except (OSError, UnicodeError) as exc:
            raise ConfigError(f"cannot listen on {_url_host(host)}:{port}: {exc}") from None


def _url_host(host: str) -> str:
    """A listen address as a URL writes it: an IPv6 one in brackets."""
    return f"[{host}]" if ":" in host else host


def _parse_backends(items: list[str]) -> dict[Route, str]:
    parsed: dict[Route, str] = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not ROUTE_NAME.fullmatch(name.strip()):
            raise ConfigError(f"--backend {item!r}: expected ROUTE=URL (a route's name)")
        route = Route(name.strip())
        if not sep:
            raise ConfigError(f"--backend {item!r}: expected ROUTE=URL")
        parsed[route] = normalize_backend_url(url.strip(), f"--backend {name}")
    return parsed


def _serve(args: argparse.Namespace, tools: Mapping[str, Command], plugins: Plugins) -> int:
    from gateway.serve import run, serve

    if args.emulate:  # --emul, abbreviated, is seen only now: its command loaded late
        tool = tools.get("emulate") or _load("emulate", "serve --emulate", plugins)
        return 2 if tool is None else _serve_emulated(args, cast(ServesEmulated, tool))
    config_path = _config_path(args.config)

    def reread() -> Config:
        return resolve_config(
            config_path, args.host, args.port, args.backend, log_level=args.log_level
        )

    config = reread()
    configure_logging(config.logging.level)
    _warn(config)
    _check_listen(config.server.host, config.server.port)
    print(
        f"specroute gateway on http://{_url_host(config.server.host)}:{config.server.port}/v1 "
        f"({_routes_line(config)})",
        file=sys.stderr,
        flush=True,
    )
    run(serve(config, reread if config_path is not None else None))
    return 0


def _serve_emulated(args: argparse.Namespace, tool: ServesEmulated) -> int:
    """serve --emulate: the installed `emulate` command serves the gateway in front of
    EMULATED servers; the --config file, if any, resolved here as `serve` resolves it."""
    config = None
    if args.config is not None:  # the config's routes, each on emulated servers
        config = resolve_config(args.config, args.host, args.port, [], log_level=args.log_level)
        configure_logging(config.logging.level)
        _check_listen(config.server.host, config.server.port)
    else:
        configure_logging(args.log_level or "info")
    return tool.serve_emulated(args, config)


if __name__ == "__main__":
    sys.exit(main())
