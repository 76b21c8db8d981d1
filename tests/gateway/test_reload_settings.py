"""SIGHUP: every config key is either applied by a reload or refused by name, and the
log level, the one process-wide setting, really changes (it used to be accepted and
then ignored); the files a reload reads are read off the event loop, and a FIFO among
them is refused at once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import functools
import os
import re
import signal
import time
import types
import typing
from collections.abc import AsyncIterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from classifier.acceptance_model import AcceptanceModel, acceptance_features
from classifier.features import Workload
from classifier.types import Route
from gateway import serve
from gateway.config import (
    Config,
    ConfigError,
    LatencyTargetConfig,
    LoggingConfig,
    RouteConfig,
    load_config,
    parse_config,
)
from gateway.runtime import RELOADABLE, Runtime, changed_keys, is_reloadable
from gateway.state import RUNTIME
from gateway.telemetry import configure_logging
from tests.gateway.test_start_files import RELEASE_S, fifo_released_after
from tests.support import wait_until

BACKENDS = {"speculative": {"urls": ["http://a:1"]}, "baseline": {"urls": ["http://b:2"]}}
BASE = parse_config({"backends": BACKENDS})


def leaf_keys(cls: type[Any], path: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    keys = []
    for fld in dataclasses.fields(cls):
        key = f"{path}.{fld.name}" if path else fld.name
        hint = hints[fld.name]
        members = [m for m in typing.get_args(hint) if m is not type(None)]
        if typing.get_origin(hint) is types.UnionType and len(members) == 1:
            hint = members[0]  # an optional table: its keys
        keys += (
            leaf_keys(hint, key)
            if isinstance(hint, type) and dataclasses.is_dataclass(hint)
            else [key]
        )
    return keys


def with_value(obj: Any, key: str, value: object) -> Any:
    name, _, rest = key.partition(".")
    new = with_value(getattr(obj, name), rest, value) if rest else value
    return dataclasses.replace(obj, **{name: new})


def other_value(key: str, value: object, tmp_path: Path) -> object:
    """A different value that a reload could apply (files and variables exist)."""
    special: dict[str, object] = {
        "routing.policy": "rules",
        "routing.tokenizer": "o200k_base",
        "logging.level": "error",
        "routing.tuning.contradiction_ratio": 2.0,
        "routing.guards.spec_max_inflight": 8,  # unset by default: the profile's
        "routing.profile": "off",
        "record.redaction": "off",
        "routing.model_path": str(model_file(tmp_path)),
        "auth.api_keys_env": "RELOAD_TEST_KEYS",
        "auth.metrics_token_env": "RELOAD_TEST_TOKEN",
        "auth.api_keys_file": str(keys_file(tmp_path)),
        "latency_targets": {"m": LatencyTargetConfig(ttft_ms=200.0)},
    }
    if key in special:
        return special[key]
    if key == "routes":  # one more route: the servers change
        assert isinstance(value, Mapping)
        return {**value, Route("c"): RouteConfig(urls=("http://c:3",))}
    if isinstance(value, bool):
        return not value
    if isinstance(value, enum.Enum):
        members = list(type(value))
        return members[(members.index(value) + 1) % len(members)]
    if isinstance(value, int | float):
        return value + 1 if isinstance(value, int) else (value / 2 or 0.01)  # 0.0: off
    if value is None:
        return 0.01
    if isinstance(value, tuple):
        return (*value, "http://c:3")
    assert isinstance(value, str), key
    return f"{value}-changed"


def model_file(tmp_path: Path) -> Path:
    n = len(acceptance_features(Workload.CHAT, False, 0.0, 1))
    model = AcceptanceModel((0.0,) * n, 0.6, 100, 0.01, 4)
    path = tmp_path / "model.json"
    path.write_text(model.to_json())
    return path


def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys"
    path.write_text("a-key\n")
    return path


def bare_app(config: Config) -> web.Application:
    app = web.Application()
    app[RUNTIME] = Runtime(config)
    return app


@pytest.mark.parametrize("key", leaf_keys(Config))
def test_every_key_is_applied_or_refused_by_name(
    key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELOAD_TEST_KEYS", "k1,k2")
    monkeypatch.setenv("RELOAD_TEST_TOKEN", "t")
    levels: list[str] = []
    monkeypatch.setattr(serve, "configure_logging", levels.append)  # the real one: below
    old_value = functools.reduce(getattr, key.split("."), BASE)
    new = with_value(BASE, key, other_value(key, old_value, tmp_path))
    assert changed_keys(BASE, new) == [key]
    app = bare_app(BASE)
    before = app[RUNTIME].current
    if not is_reloadable(key):
        with pytest.raises(ConfigError, match=rf"reload refused: {re.escape(key)} need a restart"):
            app[RUNTIME].reload(new)
        assert serve.reload(app, lambda: new) is False
        assert app[RUNTIME].current is before
        return
    assert serve.reload(app, lambda: new) is True
    now = app[RUNTIME].current
    assert now.config == new  # what every request reads from
    if key.startswith("routing."):
        assert now.policy is not before.policy  # rebuilt from the new table
    if key.startswith("auth."):
        assert now.keys != before.keys  # re-read
    assert levels == (["error"] if key == "logging.level" else [])


def test_reloadable_names_only_real_keys() -> None:
    keys = leaf_keys(Config)
    for entry in RELOADABLE:
        assert any(k == entry or k.startswith(entry + ".") for k in keys), entry


def test_a_refusal_names_every_key_that_needs_a_restart() -> None:
    new = with_value(with_value(BASE, "server.port", 9), "routing.tokenizer", "o200k_base")
    new = with_value(new, "routing.policy", "rules")  # reloadable: does not count
    with pytest.raises(ConfigError) as exc:
        Runtime(BASE).reload(new)
    assert str(exc.value) == (
        "config: reload refused: server.port, routing.tokenizer need a restart"
    )


@pytest.fixture
def production_logging(monkeypatch: pytest.MonkeyPatch) -> Any:
    """configure_logging as `specroute serve` runs it (cached loggers), undone after."""
    saved = structlog.get_config()
    # serve.reload logs with its module logger; a fresh proxy keeps the cached one here.
    monkeypatch.setattr(serve, "log", structlog.get_logger("specroute.serve"))
    yield
    structlog.configure(**saved)


def test_reload_applies_the_log_level(
    production_logging: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("info")
    probe = structlog.get_logger("specroute.probe")
    probe.info("before_reload")  # cached now, with the processors of "info"
    app = bare_app(BASE)
    quiet = dataclasses.replace(BASE, logging=LoggingConfig(level="error"))
    assert serve.reload(app, lambda: quiet) is True
    probe.info("info_after_reload")
    probe.warning("warning_after_reload")
    probe.error("error_after_reload")
    err = capsys.readouterr().err
    assert "before_reload" in err and "config_reloaded" in err
    assert "info_after_reload" not in err and "warning_after_reload" not in err
    assert "error_after_reload" in err
    loud = dataclasses.replace(BASE, logging=LoggingConfig(level="debug"))
    assert serve.reload(app, lambda: loud) is True
    probe.debug("debug_after_second_reload")
    assert "debug_after_second_reload" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[server]\nhost = '\xff'\n", "is not valid TOML: 'utf-8' codec can't decode byte 0xff"),
        (b"[server]\ndrain_s = nan\n", "config: server.drain_s must be a finite number, got nan"),
        (b"[upstream]\nread_timeout_s = 1e400\n", "upstream.read_timeout_s must be a finite"),
    ],
)
def test_sighup_refuses_a_file_of_any_content_in_one_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    """A config file that is not UTF-8 used to leave serve.reload as a UnicodeDecodeError
    (an asyncio callback traceback), and nan or 1e400 used to be applied."""
    path = tmp_path / "config.toml"
    path.write_bytes(
        b'[backends]\nspeculative.urls = ["http://a:1"]\nbaseline.urls = ["http://b:2"]\n'
    )
    app = bare_app(load_config(path))
    before = app[RUNTIME].current
    path.write_bytes(path.read_bytes() + content)
    with capture_logs() as logs:
        assert serve.reload(app, lambda: load_config(path)) is False
    (line,) = [e for e in logs if e["event"] == "config_reload_rejected"]
    assert message in line["error"]
    assert app[RUNTIME].current is before


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, spec: TestServer, base: TestServer, port: int
) -> AsyncIterator[tuple[aiohttp.ClientSession, str, Path]]:
    """`specroute serve` in this process, with its own SIGHUP handler, on a config file
    that names a keys file (old-key): a session, the gateway's URL, the keys' path."""
    keys, path = tmp_path / "keys", tmp_path / "config.toml"
    keys.write_text("old-key\n")
    path.write_text(
        f'[server]\nport = {port}\ndrain_s = 0.1\n[backends]\nspeculative.urls = ["'
        f'{spec.make_url("")}"]\nbaseline.urls = ["{base.make_url("")}"]\n'
        f'[routing]\npolicy = "rules"\n[auth]\napi_keys_file = "{keys}"\n'
    )
    ready = asyncio.Event()
    task = asyncio.create_task(
        serve.serve(load_config(path), lambda: load_config(path), ready=ready)
    )
    try:
        await asyncio.wait_for(ready.wait(), 10)
        async with aiohttp.ClientSession() as session:
            yield session, f"http://127.0.0.1:{port}", keys
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _health_at_once(session: aiohttp.ClientSession, url: str) -> None:
    started = time.monotonic()
    async with session.get(f"{url}/health") as health:
        assert health.status == 200
    assert time.monotonic() - started < RELEASE_S / 2


def _reloads(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"].startswith("config_reload")]


@pytest.mark.parametrize(
    ("name", "key"), [("keys", "auth.api_keys_file"), ("config.toml", "--config")]
)
async def test_sighup_with_a_fifo_for_its_file_is_refused_at_once(
    tmp_path: Path,
    spec_server: TestServer,
    base_server: TestServer,
    unused_tcp_port: int,
    name: str,
    key: str,
) -> None:
    """The reload read the keys file on the event loop: a FIFO there held /health (and
    every request) until a writer came. config.toml itself a FIFO was waited on off the
    loop, one more thread for each SIGHUP. Now either is refused at once, in one line."""
    async with serving(tmp_path, spec_server, base_server, unused_tcp_port) as (session, url, keys):
        keys.write_text("new-key\n")  # what a late read would swap in
        path = tmp_path / name
        content = path.read_bytes()
        path.unlink()
        with capture_logs() as logs, fifo_released_after(path, content):
            os.kill(os.getpid(), signal.SIGHUP)
            await _health_at_once(session, url)
            await wait_until(lambda: bool(_reloads(logs)), "the reload", timeout_s=RELEASE_S / 2)
        (line,) = _reloads(logs)
        assert line["event"] == "config_reload_rejected"
        assert line["error"] == f"config: {key}: {path}: is a FIFO, not a regular file"
        headers = {"Authorization": "Bearer old-key"}
        async with session.get(f"{url}/stats", headers=headers) as kept:
            assert kept.status == 200  # the running keys stay
