"""Shared paths and helpers for the deploy/ tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def require_binary(name: str, how: str) -> str:
    """The binary's path, or a loud skip naming how CI installs it."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(
            f"SKIPPED LOUDLY: `{name}` is not installed, so this deploy/ check did not run ({how})"
        )
    return path


def run(cmd: list[str], timeout: float = 30, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        cmd, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )
