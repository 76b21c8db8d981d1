"""The CLI as a user meets it: --version, every command's --help (a description, examples,
each flag's help and default), the environment variables, `specroute config`."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from classifier.types import Route
from gateway import cli, commands
from gateway.backends.pool import url_label
from gateway.cli import ENVIRONMENT, apply_environment, build_parser, main, resolve_config
from gateway.config import Config
from tooling.emulator.cli import build_parser as build_emulate_parser

ROOT = Path(__file__).resolve().parents[2]
CONFIG = (
    '[backends.speculative]\nurls = ["http://s:1"]\n[backends.baseline]\nurls = ["http://b:2"]\n'
)


# What specroute-tools registers in the `specroute.commands` entry-point group.
TOOLS = {"emulate", "demo", "bench", "advise", "train", "gpu"}


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser, the installed commands' flags loaded, and `specroute
    emulate` as tooling.emulator.main builds it on its own."""
    tools = {name: commands.load(entry) for name, entry in cli.installed().items()}
    parser = build_parser(tools)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {"specroute": parser, **sub.choices, "emulate (alone)": build_emulate_parser()}


COMMANDS = _commands()


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"specroute {importlib.metadata.version('specroute')}\n"


def test_every_command_is_listed() -> None:
    """The gateway's own, and the tools' from their entry points (an editable install
    made before an entry point was added lacks it: pip install -e ./tooling again)."""
    assert set(cli.installed()) == TOOLS, "pip install -e ./tooling: its entry points changed"
    assert set(COMMANDS) == {"specroute", "emulate (alone)", *cli._COMMANDS, *TOOLS}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_a_description_and_examples(name: str) -> None:
    parser = COMMANDS[name]
    assert parser.description and len(parser.description) > 40, name
    assert parser.epilog and parser.epilog.startswith("examples:\n"), name
    examples = [line.strip() for line in parser.epilog.split("\n\n")[0].splitlines()[1:]]
    command = "specroute" if name == "specroute" else f"specroute {name.split()[0]}"
    assert 1 <= len(examples) <= 4 and all(e.startswith(command) for e in examples), examples


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_flag_has_help_and_shows_its_default(name: str) -> None:
    parser = COMMANDS[name]
    formatter = parser._get_formatter()
    missing, no_default = [], []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        flag = "/".join(action.option_strings) or action.dest
        if not action.help:
            missing.append(flag)
            continue
        has_default = action.default not in (None, False, [], argparse.SUPPRESS)
        shown = formatter._expand_help(action) if action.help else ""
        if action.option_strings and has_default and "default" not in shown:
            no_default.append(flag)
    assert not missing, f"specroute {name}: no help for {missing}"
    assert not no_default, f"specroute {name}: no default shown for {no_default}"


def test_serve_help_names_each_variable_and_the_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for var in ("SPECROUTE_CONFIG", "SPECROUTE_HOST", "SPECROUTE_PORT", "SPECROUTE_LOG_LEVEL"):
        assert out.count(var) == 2, var  # in the flag's help and in the list
    assert "a flag beats its variable, which beats config.toml" in out
    assert out.rstrip().endswith(f"specroute {cli.version()}")


# ---- the commands of other distributions: entry points (gateway/commands.py) ----

# Which tooling modules a fresh interpreter holds after `specroute ARGV`.
_TOOLING_LOADED = (
    "import sys, contextlib; from gateway.cli import main\n"
    "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(None):\n"
    "    main(sys.argv[1:])\n"
    "print(sorted({m for m in sys.modules if m.split('.')[0] == 'tooling'}))"
)


def _tooling_loaded(*argv: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-c", _TOOLING_LOADED, *argv],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return set(ast.literal_eval(result.stdout.splitlines()[-1]))


def test_the_gateway_imports_no_tool_and_a_tool_only_its_own_module() -> None:
    """`specroute --help` lists the installed commands from their entry points alone."""
    assert _tooling_loaded("--help") == set()
    assert _tooling_loaded("serve", "--help") == set()
    assert _tooling_loaded("config", "--schema") == set()
    loaded = _tooling_loaded("train", "--help")
    assert "tooling.train" in loaded
    others = {"tooling.demo", "tooling.advise", "tooling.gpu", "tooling.bench.cli"}
    assert not loaded & (others | {"tooling.emulate", "tooling.emulator.cli"}), loaded
    assert "tooling.emulate" in _tooling_loaded("serve", "--emulate", "--help")


@pytest.fixture
def hello(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A command another distribution registers: `specroute hello`, from a module of its own."""
    (tmp_path / "hello_command.py").write_text(
        "from gateway.commands import Help\n"
        "HELP = Help('say hello', 'Say hello to someone, a command from elsewhere.',"
        " ('specroute hello --to you',))\n"
        "def add_arguments(p):\n"
        "    p.add_argument('--to', default='world', help='whom')\n"
        "def run(args, argv):\n"
        "    print(f'hello {args.to}')\n"
        "    return 7\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = importlib.metadata.EntryPoint("hello", "hello_command", commands.GROUP)
    monkeypatch.setattr(commands, "installed", lambda: {"hello": entry})


@pytest.mark.usefixtures("hello")
def test_a_registered_command_is_listed_and_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hello", "--to", "you"]) == 7
    assert capsys.readouterr().out == "hello you\n"
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "    hello     from hello_command" in out and "bench" not in out
    with pytest.raises(SystemExit):
        main(["hello", "--help"])
    assert "specroute hello --to you" in capsys.readouterr().out


def test_a_registered_module_that_is_no_command_is_named() -> None:
    entry = importlib.metadata.EntryPoint("jsonish", "json", commands.GROUP)
    with pytest.raises(TypeError, match="jsonish = json: not a command, it has no HELP"):
        commands.load(entry)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["bench", "--emulate"],
            "specroute bench: not a command of the gateway (serve, ext-proc, profile, config), "
            "and no other commands are installed; the tools' come with specroute-tools, "
            "from a specroute checkout: pip install ./tooling",
        ),
        (
            ["serve", "--emulate"],
            "specroute serve --emulate: needs specroute-tools (the tooling package), which is "
            "not installed; from a specroute checkout: pip install ./tooling",
        ),
    ],
)
def test_with_nothing_registered_one_line_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    monkeypatch.setattr(commands, "installed", dict)
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [line]
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "other commands: none installed (from a specroute checkout" in capsys.readouterr().out


# ---- environment: a flag beats its variable, which beats config.toml ----


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for var in ENVIRONMENT.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)  # no ./config.toml
    path = tmp_path / "deploy.toml"
    path.write_text(
        CONFIG + '[server]\nhost = "10.0.0.1"\nport = 8000\n[logging]\nlevel = "info"\n'
    )
    return path


def _serve_config(argv: list[str]) -> tuple[argparse.Namespace, Config]:
    args = build_parser({}).parse_args(["serve", *argv])
    apply_environment(args)
    config = resolve_config(
        args.config, args.host, args.port, args.backend, log_level=args.log_level
    )
    return args, config


def test_the_variables_fill_flags_not_given(
    clean_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECROUTE_CONFIG", str(clean_environment))
    _, config = _serve_config([])
    assert (config.server.host, config.server.port) == ("10.0.0.1", 8000)
    monkeypatch.setenv("SPECROUTE_HOST", "0.0.0.0")
    monkeypatch.setenv("SPECROUTE_PORT", "9000")
    monkeypatch.setenv("SPECROUTE_LOG_LEVEL", "debug")
    _, config = _serve_config([])
    assert (config.server.host, config.server.port) == ("0.0.0.0", 9000)
    assert config.logging.level == "debug"
    _, config = _serve_config(["--port", "7000", "--log-level", "error"])
    assert (config.server.host, config.server.port) == ("0.0.0.0", 7000)
    assert config.logging.level == "error"


def test_the_config_flag_beats_its_variable(
    clean_environment: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    other = tmp_path / "other.toml"
    other.write_text(CONFIG + "[server]\nport = 8111\n")
    monkeypatch.setenv("SPECROUTE_CONFIG", str(clean_environment))
    args, config = _serve_config(["--config", str(other)])
    assert args.config == other and config.server.port == 8111


def test_ext_proc_ports_fall_back_to_variables_then_defaults(
    clean_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = build_parser({}).parse_args(["ext-proc"])
    apply_environment(args)
    assert (args.port, args.metrics_port) == (9002, 9003)
    monkeypatch.setenv("SPECROUTE_METRICS_PORT", "9100")
    args = build_parser({}).parse_args(["ext-proc", "--port", "9001"])
    apply_environment(args)
    assert (args.port, args.metrics_port) == (9001, 9100)


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        (
            "SPECROUTE_PORT",
            "http",
            "specroute: SPECROUTE_PORT='http': not a port number (1-65535, ASCII digits)",
        ),
        (
            "SPECROUTE_LOG_LEVEL",
            "loud",
            "specroute: SPECROUTE_LOG_LEVEL='loud': must be one of debug, info, warning, error",
        ),
    ],
)
def test_a_bad_variable_is_named(
    clean_environment: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    var: str,
    value: str,
    message: str,
) -> None:
    monkeypatch.setenv(var, value)
    assert main(["serve", "--config", str(clean_environment)]) == 2
    assert capsys.readouterr().err.strip() == message


# ---- specroute config ----


def test_config_schema_prints_the_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is False


def test_config_check_lists_every_problem(
    clean_environment: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG + "[server]\nprot = 1\n[routing]\npolciy = 'rules'\n")
    assert main(["config", "--check", str(bad)]) == 2
    assert capsys.readouterr().err == (
        "specroute: config: 2 errors:\n"
        "  - unknown key 'server.prot' (did you mean 'server.port'?)\n"
        "  - unknown key 'routing.polciy' (did you mean 'routing.policy'?)\n"
    )
    assert main(["config", "--check", str(ROOT / "config.toml")]) == 0
    assert capsys.readouterr().out == f"{ROOT / 'config.toml'}: ok\n"


def test_config_check_reads_the_file_serve_would(
    clean_environment: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "--check"]) == 2
    assert "no file to check" in capsys.readouterr().err
    monkeypatch.setenv("SPECROUTE_CONFIG", str(clean_environment))
    assert main(["config", "--check"]) == 0
    assert capsys.readouterr().out == f"{clean_environment}: ok\n"


# ---- hosts, ports and URLs from flags and variables: one line, exit 2 (issue 50, row j) ----


@pytest.mark.parametrize(
    ("variables", "argv", "message"),
    [
        ({"SPECROUTE_PORT": "99999"}, [], "SPECROUTE_PORT='99999': not a port number"),
        ({"SPECROUTE_PORT": "\uff18\uff10\uff10\uff10"}, [], "not a port number"),
        ({"SPECROUTE_PORT": "0"}, [], "SPECROUTE_PORT='0': not a port number"),
        ({"SPECROUTE_PORT": "99999"}, ["--port", "70000"], "--port='70000': not a port number"),
        ({}, ["--port", "-1"], "--port='-1': not a port number (1-65535, ASCII digits)"),
        ({"SPECROUTE_HOST": "bad host"}, [], "SPECROUTE_HOST='bad host': not a host name or IP"),
        ({}, ["--host", "999.1.1.1"], "--host='999.1.1.1': not a host name or IP address"),
        ({}, ["--host", "h\n"], "--host='h\\n': not a host name or IP address"),
        (
            {},
            ["--backend", "speculative=http://127.0.0.1:99999"],
            "config: --backend speculative: 'http://127.0.0.1:99999' has a bad port",
        ),
        (
            {},
            ["--backend", "speculative=http://127.0.0.1:abc"],
            "config: --backend speculative: 'http://127.0.0.1:abc' has a bad port",
        ),
        (
            {},
            ["--backend", "speculative=http://a:1/\r\nX: 1"],
            "has a space or a control character",
        ),
    ],
)
def test_a_bad_host_port_or_url_is_one_line_and_exit_2(
    clean_environment: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variables: dict[str, str],
    argv: list[str],
    message: str,
) -> None:
    for var, value in variables.items():
        monkeypatch.setenv(var, value)
    assert main(["serve", "--config", str(clean_environment), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specroute: ") and err.count("\n") == 1, err
    assert message in err


def test_ext_proc_ports_are_checked_too(
    clean_environment: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPECROUTE_METRICS_PORT", "65536")
    assert main(["ext-proc", "--config", str(clean_environment)]) == 2
    assert capsys.readouterr().err == (
        "specroute: SPECROUTE_METRICS_PORT='65536': not a port number (1-65535, ASCII digits)\n"
    )


def test_a_host_that_does_not_resolve_is_one_line(
    clean_environment: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before the bind, whose traceback it was; the resolver is stubbed (no DNS)."""

    def unknown(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unknown)
    assert main(["serve", "--config", str(clean_environment), "--host", "nowhere"]) == 2
    assert capsys.readouterr().err == (
        "specroute: cannot listen on nowhere:8000: [Errno -2] Name or service not known\n"
    )


def test_the_banner_never_shows_a_password() -> None:
    config = resolve_config(
        None,
        None,
        None,
        ["speculative=http://user:s3cret@127.0.0.1:1/v1", "baseline=http://127.0.0.1:2"],
    )
    assert config.routes[Route.SPECULATIVE].urls == ("http://user:s3cret@127.0.0.1:1",)
    line = cli._routes_line(config)
    assert line == "speculative=http://127.0.0.1:1 baseline=http://127.0.0.1:2"
    assert url_label("http://user:s3cret@[::1]:1") == "http://[::1]:1"
    assert url_label("http://:s3cret@h:1/p") == "http://h:1/p"


def test_config_check_warns_of_two_routes_on_one_server(
    clean_environment: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    shared = tmp_path / "shared.toml"
    shared.write_text(CONFIG.replace("http://b:2", "http://s:1/v1"))
    assert main(["config", "--check", str(shared)]) == 0
    out = capsys.readouterr()
    assert (
        out.err
        == "specroute: warning: routes speculative, baseline name the same server http://s:1\n"
    )
    assert out.out == f"{shared}: ok\n"
