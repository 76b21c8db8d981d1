"""Every file the gateway reads besides config.toml: used whole, or refused in one line.

`read_file` turns any content into a value or a FileUnusable (a ConfigError), one
line that names the key, the path and why: no such file, a directory, a FIFO or a
device, no permission, too large, or content its parser refuses (bytes that are not
UTF-8 or JSON, JSON of another shape, a number out of range). Parsers are pure
functions of the bytes, so whatever one raises is said of the content; no content
escapes as a traceback.

Only regular files are read, never waited on, and never past a bound
(gateway/config.py's read_regular, which reads config.toml too). An async caller
reads through `off_loop`, so even a slow disk never stalls /health.

What a refusal means depends on whose file it is:

- the operator's, named in config.toml (routing.model_path, auth.api_keys_file): a
  config error, at start and on SIGHUP, like a bad key (`read_file`);
- the gateway's own memory across restarts (routing.state_path, routing.profile_path,
  written by it or by `specroute profile`): never needed to serve, so the gateway
  starts without it, after one line `start_file_unusable` (`read_optional`). A missing
  one is no news: the first start has none.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable
from typing import TypeVar

import structlog

from gateway.config import ConfigError, Unreadable, not_regular, read_regular

log = structlog.get_logger("specroute.files")

T = TypeVar("T")
__all__ = ["FileUnusable", "not_regular", "off_loop", "read_file", "read_optional"]


class FileUnusable(ConfigError):
    """A file that cannot be used; str() is one line naming the key, the path and why."""

    def __init__(self, key: str, path: str, why: str, *, missing: bool = False) -> None:
        super().__init__(f"config: {key}: {path}: {why}")
        self.key, self.path, self.why, self.missing = key, path, why, missing


def read_file(key: str, path: str, parse: Callable[[bytes], T]) -> T:
    """The file at `path` (the value of config key `key`), parsed; else FileUnusable."""
    data = _read_bytes(key, path)
    try:
        return parse(data)
    except Exception as exc:  # any content: the parser's refusal, or a parser's gap
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise FileUnusable(key, path, why[:300]) from None


def read_optional(key: str, path: str, parse: Callable[[bytes], T]) -> T | None:
    """The file parsed, or None: no path or no file says nothing, any other refusal one
    line (`start_file_unusable`), and the caller goes on without it."""
    if not path:
        return None
    try:
        return read_file(key, path, parse)
    except FileUnusable as exc:
        if not exc.missing:
            log.warning("start_file_unusable", key=key, path=path, error=exc.why)
        return None


async def off_loop(fn: Callable[[], T]) -> T:
    """fn() on a daemon thread of its own, awaited: a read that blocks (a slow or hung
    mount, a config.toml swapped for a FIFO) holds neither the event loop nor the
    process's exit, which asyncio.run's default executor would wait for."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            settle = functools.partial(_set_result, done, fn())
        except BaseException as exc:  # handed to the awaiting task, raised there
            settle = functools.partial(_set_exception, done, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed while it ran
            loop.call_soon_threadsafe(settle)

    threading.Thread(target=run, name="specroute-file-read", daemon=True).start()
    return await done


def _set_result(done: asyncio.Future[T], result: T) -> None:
    if not done.done():  # else the awaiting task was cancelled
        done.set_result(result)


def _set_exception(done: asyncio.Future[T], exc: BaseException) -> None:
    if not done.done():
        done.set_exception(exc)


def _read_bytes(key: str, path: str) -> bytes:
    try:
        return read_regular(path)
    except Unreadable as exc:
        raise FileUnusable(key, path, str(exc), missing=exc.missing) from None
