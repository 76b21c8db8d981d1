"""The replicas benchmark runs to the end on one shared GPU and prints its table: every
setup at both levels, the profile's beside ratio per seed, the routes' reasons. No figure is
asserted: a few requests on a shared CI machine say nothing about splits or speed
(docs/scaling.md has the full runs)."""

from __future__ import annotations

import pytest
from benchrun import run_benchmark

SETUPS = ("1 serve", "2 serve", "2 Envoy+1 picker")


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_replicas_benchmark_smoke() -> None:
    proc = run_benchmark("replicas.py", "--smoke", "--gpus", "1", timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "EMULATED" in out and "NOT GPU measurements" in out and "loopback only" in out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| one shared GPU")]
    assert [(row[1], row[2]) for row in rows] == [(s, c) for c in ("8", "32") for s in SETUPS]
    assert "the profile's beside ratio per seed" in out and "1 GPU(s) seed 1" in out
    assert "routes/reasons of the measured requests" in out
