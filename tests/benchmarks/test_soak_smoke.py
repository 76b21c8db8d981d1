"""A short soak with injected faults: no failed request, flat tasks, no ResourceWarning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_soak_smoke() -> None:
    proc = subprocess.run(
        [sys.executable, "benchmarks/soak.py", "--duration", "15", "--concurrency", "8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert summary["ok"] and summary["failed"] == 0 and summary["requests"] > 100
    assert "backend kills+restarts" in proc.stdout
