"""The CLI as a user meets it: --version, every command's --help (a description, examples,
each flag's help and default), the environment variables, `specroute config`."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
from pathlib import Path

import pytest

from gateway import cli
from gateway.cli import ENVIRONMENT, apply_environment, build_parser, main, resolve_config
from gateway.config import Config
from tooling.emulator.cli import build_parser as build_emulate_parser

ROOT = Path(__file__).resolve().parents[2]
CONFIG = (
    '[backends.speculative]\nurls = ["http://s:1"]\n[backends.baseline]\nurls = ["http://b:2"]\n'
)


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser, the tooling commands' flags loaded."""
    tools = {name: importlib.import_module(spec.module) for name, spec in cli._TOOLS.items()}
    parser = build_parser(tools)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    commands = {name: p for name, p in sub.choices.items() if name != "emulate"}
    return {"specroute": parser, **commands, "emulate": build_emulate_parser()}


COMMANDS = _commands()


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"specroute {importlib.metadata.version('specroute')}\n"


def test_every_command_is_listed() -> None:
    assert set(COMMANDS) == {"specroute", *cli._COMMANDS}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_a_description_and_examples(name: str) -> None:
    parser = COMMANDS[name]
    assert parser.description and len(parser.description) > 40, name
    assert parser.epilog and parser.epilog.startswith("examples:\n"), name
    examples = [line.strip() for line in parser.epilog.split("\n\n")[0].splitlines()[1:]]
    command = "specroute" if name == "specroute" else f"specroute {name}"
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
        ("SPECROUTE_PORT", "http", "specroute: SPECROUTE_PORT='http': not a port number"),
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
