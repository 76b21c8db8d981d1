"""Every file the gateway reads besides config.toml: used whole, or refused in one line.

`read_file` turns any content into a value or a FileUnusable (a ConfigError), one
line that names the key, the path and why: no such file, a directory, no permission,
too large, or content its parser refuses (bytes that are not UTF-8 or JSON, JSON of
another shape, a number out of range). Parsers are pure functions of the bytes, so
whatever one raises is said of the content; no content escapes as a traceback.

What a refusal means depends on whose file it is:

- the operator's, named in config.toml (routing.model_path, auth.api_keys_file): a
  config error, at start and on SIGHUP, like a bad key (`read_file`);
- the gateway's own memory across restarts (routing.state_path, routing.profile_path,
  written by it or by `specroute profile`): never needed to serve, so the gateway
  starts without it, after one line `start_file_unusable` (`read_optional`). A missing
  one is no news: the first start has none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import structlog

from gateway.config import ConfigError

log = structlog.get_logger("specroute.files")

T = TypeVar("T")
# Far above any file the gateway writes or reads (a state or a profile: kilobytes); a
# path such as /dev/zero must not take the memory.
MAX_BYTES = 64 * 1024 * 1024


class FileUnusable(ConfigError):
    """A file that cannot be used; str() is one line naming the key, the path and why."""

    def __init__(self, key: str, path: str, why: str, *, missing: bool = False) -> None:
        super().__init__(f"config: {key}: {path}: {why}")
        self.key, self.path, self.why, self.missing = key, path, why, missing


def read_file(key: str, path: str, parse: Callable[[bytes], T]) -> T:
    """The file at `path` (the value of config key `key`), parsed; else FileUnusable."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        why = f"cannot read: {exc.strerror or exc}"
        raise FileUnusable(key, path, why, missing=isinstance(exc, FileNotFoundError)) from None
    if len(data) > MAX_BYTES:
        raise FileUnusable(key, path, f"larger than {MAX_BYTES} bytes")
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
