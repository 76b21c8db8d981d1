"""The overhead benchmark runs to the end and prints its figures (no speed is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from benchrun import run_benchmark


def test_overhead_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    proc = run_benchmark("overhead.py", "--smoke", "--json", str(out), timeout=110)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for figure in ("added p50", "saturation", "chunks/s", "2k-token prompt", "gateway RSS"):
        assert figure in proc.stdout
    figures = json.loads(out.read_text())
    assert figures["emulated_upstream"] is True
    assert figures["gateway_rps"] > 0 and figures["direct_rps"] > 0
