"""config.toml itself, named by --config or SPECROUTE_CONFIG, is read as every other
start-up file is (gateway/files.py): a FIFO, a device or a directory is refused at once
in one line, never waited on (issue 50, row i). SIGHUP's re-read of it:
tests/gateway/test_reload_settings.py."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import ConfigError, load_config
from gateway.files import off_loop
from tests.gateway.test_start_files import RELEASE_S, fifo_released_after

# A config that parses: what a writer coming to the FIFO would give a blocked reader.
TOML = b'[backends.speculative]\nurls = ["http://127.0.0.1:1"]\n' + (
    b'[backends.baseline]\nurls = ["http://127.0.0.1:2"]\n'
)


def _at(kind: str, tmp_path: Path) -> str:
    return {"fifo": str(tmp_path / "fifo"), "directory": str(tmp_path)}.get(kind, kind)


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "directory"])
def test_a_config_that_is_no_file_is_one_line_at_once(tmp_path: Path, kind: str) -> None:
    """Before: a FIFO held the start until a writer came; /dev/zero was read without end."""
    path = _at(kind, tmp_path)
    started = time.monotonic()
    with fifo_released_after(tmp_path / "fifo", TOML), pytest.raises(ConfigError) as exc:
        load_config(path)
    assert time.monotonic() - started < RELEASE_S / 2
    assert str(exc.value).startswith(f"config: --config: {path}: is a ")
    assert str(exc.value).endswith(", not a regular file") and "\n" not in str(exc.value)


def test_serve_with_a_fifo_as_its_config_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fifo"
    started = time.monotonic()
    with fifo_released_after(path, TOML):
        assert main(["serve", "--config", str(path)]) == 2
    assert time.monotonic() - started < RELEASE_S / 2
    err = capsys.readouterr().err
    assert err == f"specroute: config: --config: {path}: is a FIFO, not a regular file\n"


async def test_a_read_that_blocks_holds_no_event_loop() -> None:
    """What SIGHUP's re-read runs on (serve.reload_off_loop): a slow or hung mount stalls
    the read, never the loop."""
    release = threading.Event()
    read = asyncio.ensure_future(off_loop(lambda: b"late" if release.wait(5) else b""))
    await asyncio.sleep(0.05)  # the loop runs meanwhile
    assert not read.done()
    release.set()
    assert await asyncio.wait_for(read, 2) == b"late"
