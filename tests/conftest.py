"""In CI (CI set, as .ci/run is run) a skipped test fails the run.

A skip there means a check that did not run behind a green result: a tool
scripts/test.sh should have installed, an import that broke. tests/support.py's
skip_unless_ci and require_tool already fail in CI; this catches any other
skip (a pytest.skip, a skipif, an importorskip) and names it. Under pytest-xdist
(scripts/test.sh's run on all cores) the workers' reports reach this plugin in the
controller, which sets the exit status (tests/test_ci_skips.py runs both ways).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog
from pytest_aiohttp.plugin import AiohttpClient, AiohttpServer

from tests.support import in_ci


class NoSkipsInCI:
    def __init__(self) -> None:
        self.skipped: list[str] = []

    def _note(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skipped.append(report.nodeid or "(collection)")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._note(report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._note(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.skipped and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.skipped:
            terminalreporter.write_line(
                f"CI is set: {len(self.skipped)} skipped test(s) fail the run "
                f"(see the skip reasons above): {', '.join(self.skipped)}",
                red=True,
            )


def pytest_configure(config: pytest.Config) -> None:
    if in_ci():
        config.pluginmanager.register(NoSkipsInCI(), "specroute-no-skips-in-ci")


@pytest.fixture(autouse=True)
def logging_left_as_found() -> Iterator[None]:
    """Each test leaves structlog's configuration and the root logger as it found them.

    `specroute serve` and other commands call configure_logging, which binds structlog's
    printer to the sys.stderr of that moment: in a test, a capture closed after it. A
    later test in the same process then logged into a closed file ("I/O operation on
    closed file"), which only the suite's order hid; scripts/test.sh's run on all cores
    gives each worker another order.
    """
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.configure(**saved)
    root.handlers = handlers
    root.setLevel(level)


@pytest.fixture
def aiohttp_client(aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient) -> AiohttpClient:
    """pytest-aiohttp's client factory, set up after its server factory so it closes first.

    A gateway made with `aiohttp_client` polls the upstreams made with `aiohttp_server`
    every `health_interval_s`. Closed in the plugin's order, the upstreams stopped while
    the gateway still polled them, and a health connection accepted during aiohttp's
    shutdown was never closed: on a loaded 2-core CI run that surfaced as
    "unclosed transport" ResourceWarnings, errors under filterwarnings=error.
    """
    return aiohttp_client
