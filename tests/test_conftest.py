"""tests/conftest.py in both of scripts/test.sh's pytest runs, on all cores (pytest-xdist:
the skips are reported by worker processes) and one at a time: in CI a skipped test fails
the run, and no test leaves logging writing into another test's closed capture."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

A_SKIP = """
import pytest

def test_runs() -> None:
    pass

def test_skips() -> None:
    pytest.skip("on purpose")
"""

# The first configures logging as `specroute serve` does, inside its capture; the second
# logs after that capture was closed.
LOGGING_THEN_A_LOG = """
import pytest
import structlog

from gateway.telemetry import configure_logging

def test_configures_logging(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    structlog.get_logger("first").info("inside_the_capture")

def test_logs_after(capsys: pytest.CaptureFixture[str]) -> None:
    structlog.get_logger("second").info("after_the_capture")
"""


def run_pytest(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest on `source` alone, with tests/conftest.py as a plugin and CI set."""
    test = tmp_path / "test_one.py"
    test.write_text(source)
    plugin = ["-p", "tests.conftest", "-p", "no:cacheprovider", "-c", os.devnull]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *plugin,
            *args,
            "-q",
            "--rootdir",
            str(tmp_path),
            str(test),
        ],
        cwd=ROOT,
        env={**os.environ, "CI": "true", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=100,
    )


WAYS = pytest.mark.parametrize("workers", [["-n", "2"], []], ids=["xdist", "alone"])


@WAYS
def test_a_skip_fails_the_run_when_ci_is_set(tmp_path: Path, workers: list[str]) -> None:
    proc = run_pytest(tmp_path, A_SKIP, *workers)
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, proc.stdout + proc.stderr
    assert "1 passed, 1 skipped" in proc.stdout, proc.stdout
    assert "CI is set: 1 skipped test(s) fail the run" in proc.stdout, proc.stdout


def test_a_test_that_configures_logging_leaves_the_next_one_able_to_log(tmp_path: Path) -> None:
    proc = run_pytest(tmp_path, LOGGING_THEN_A_LOG)
    assert proc.returncode == pytest.ExitCode.OK, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout, proc.stdout
