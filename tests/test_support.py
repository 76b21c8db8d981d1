"""tests/support.py: the wait fails naming what it waited for; nothing skips in CI."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support import in_ci, require_tool, skip_unless_ci, wait_until


async def test_wait_until_returns_the_first_truthy_value() -> None:
    seen: list[int] = []

    def grows() -> list[int] | None:
        seen.append(len(seen))
        return seen if len(seen) >= 3 else None

    assert await wait_until(grows, "three polls") == [0, 1, 2]


async def test_wait_until_awaits_an_async_condition() -> None:
    calls = 0

    async def third() -> str:
        nonlocal calls
        calls += 1
        return "done" if calls == 3 else ""

    assert await wait_until(third, "the third call") == "done"


async def test_wait_until_fails_naming_what_it_waited_for() -> None:
    with pytest.raises(
        AssertionError, match=r"after 0.05 s waiting for the moon \(last value: 0\)"
    ):
        await wait_until(lambda: 0, "the moon", timeout_s=0.05)


async def test_wait_until_treats_ignored_errors_as_not_yet_and_chains_the_last() -> None:
    calls = 0

    def flaky() -> bool:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("not listening yet")
        return True

    assert await wait_until(flaky, "a listener", ignoring=(ConnectionError,))

    def never() -> bool:
        raise ConnectionError("refused")

    with pytest.raises(AssertionError, match="last error: ConnectionError") as info:
        await wait_until(never, "a listener", timeout_s=0.05, ignoring=(ConnectionError,))
    assert isinstance(info.value.__cause__, ConnectionError)
    with pytest.raises(ValueError):  # an error it was not told to ignore stops it at once
        await wait_until(lambda: int("x"), "a number", ignoring=(ConnectionError,))


def test_require_tool_looks_in_the_venv_first() -> None:
    assert require_tool(Path(sys.executable).name, "the venv") == sys.executable


@pytest.mark.parametrize(("ci", "outcome"), [("true", "fail"), ("", "skip"), ("false", "skip")])
def test_a_missing_tool_skips_on_a_developer_machine_and_fails_in_ci(
    monkeypatch: pytest.MonkeyPatch, ci: str, outcome: str
) -> None:
    monkeypatch.setenv("CI", ci)
    assert in_ci() == (outcome == "fail")
    expected = pytest.fail.Exception if outcome == "fail" else pytest.skip.Exception
    with pytest.raises(expected, match="no-such-tool-xyz"):
        require_tool("no-such-tool-xyz", "nowhere")
    with pytest.raises(expected, match="a reason"):
        skip_unless_ci("a reason")
