"""The overhead benchmark runs to the end and prints its figures (no speed is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_overhead_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/overhead.py", "--smoke", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for figure in ("added p50", "saturation", "chunks/s", "2k-token prompt", "gateway RSS"):
        assert figure in proc.stdout
    figures = json.loads(out.read_text())
    assert figures["emulated_upstream"] is True
    assert figures["gateway_rps"] > 0 and figures["direct_rps"] > 0
