"""benchmarks/slo.py runs to the end, says EMULATED and the measured GPU profile on
every table, and gives both policies' met share and mean (the figures: docs/api.md)."""

from __future__ import annotations

import pytest
from benchrun import run_benchmark


@pytest.mark.timeout(200)
def test_slo_smoke() -> None:
    proc = run_benchmark("slo.py", "--seeds", "3", "--per-workload", "10", timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "EMULATED (virtual time, not a GPU run) on the measured GPU profile" in out
    assert "h200" in out.lower()
    for row in ("EMULATED |    3 | mean-minimising", "EMULATED |    3 | target-aware"):
        assert row in out
    assert "EMULATED: target-aware mean e2e / mean-minimising:" in out
