"""The policy-vs-oracle benchmark runs to the end on both topologies and prints its table
(no ratio is asserted: small counts on a shared CI machine say nothing about speed)."""

from __future__ import annotations

import pytest
from benchrun import run_benchmark


@pytest.mark.parametrize("gpus", ["1", "2"])
def test_policy_vs_oracle_benchmark_smoke(gpus: str) -> None:
    proc = run_benchmark("policy_vs_oracle.py", "--smoke", "--gpus", gpus, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "EMULATED" in out and ("ONE GPU" if gpus == "1" else "a GPU per server") in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["8"])]
    assert [row[0] for row in rows] == ["1", "8"] and all(len(row) == 8 for row in rows)
    assert "given the answer's true length" in out and "acceptance a per workload" in out
    # The profiled gateway's start-up profile was in before the first timed request.
    assert out.index("profile (emulated)") < out.index("concurrency")
    assert "starts with code's acceptance" in out
