"""SPECROUTE_LOG_LEVEL and --log-level in any case: WARNING is the level warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import ENVIRONMENT, apply_environment, build_parser, resolve_config

CONFIG = (
    "[backends.speculative]\nurls = ['http://127.0.0.1:8001']\n"
    "[backends.baseline]\nurls = ['http://127.0.0.1:8002']\n"
)


@pytest.fixture
def config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for var in ENVIRONMENT.values():
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    return path


def _level(argv: list[str]) -> str:
    args = build_parser({}).parse_args(argv)
    apply_environment(args)
    config = resolve_config(args.config, None, None, [], log_level=args.log_level)
    return config.logging.level


@pytest.mark.parametrize("value", ["WARNING", "Warning", "warning"])
def test_the_variable_in_any_case(
    config_file: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("SPECROUTE_LOG_LEVEL", value)
    assert _level(["serve", "--config", str(config_file)]) == "warning"
    assert _level(["ext-proc", "--config", str(config_file)]) == "warning"


def test_the_flag_in_any_case(config_file: Path) -> None:
    assert _level(["serve", "--config", str(config_file), "--log-level", "DEBUG"]) == "debug"


def test_a_level_that_is_none_is_still_refused(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECROUTE_LOG_LEVEL", "LOUD")
    with pytest.raises(ValueError, match="SPECROUTE_LOG_LEVEL='LOUD': must be one of debug"):
        _level(["serve", "--config", str(config_file)])
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(["serve", "--log-level", "LOUD"])
