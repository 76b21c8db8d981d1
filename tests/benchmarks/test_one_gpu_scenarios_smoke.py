"""docs/decision.md's one-GPU scenarios run to the end and print every row (the figures
themselves are asserted in tests/classifier/test_shared_gpu_simulation.py)."""

from __future__ import annotations

import pytest
from benchrun import run_benchmark


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_one_gpu_scenarios_smoke() -> None:
    proc = run_benchmark("one_gpu_scenarios.py", timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "EMULATED (measured H200, virtual time)" in out
    for row in ("c=1 / per-request oracle", "learned, 1 GPU, c=32", "bursts of one kind"):
        assert row in out
