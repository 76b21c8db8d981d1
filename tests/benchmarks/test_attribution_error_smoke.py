"""The attribution-error benchmark runs to the end and prints its table (no error bound
is asserted: a handful of requests on a shared CI machine says little)."""

from __future__ import annotations

from benchrun import run_benchmark


def test_attribution_error_benchmark_smoke() -> None:
    proc = run_benchmark(
        "attribution_error.py", "--smoke", "--concurrency", "1", "--per-workload", "2", timeout=110
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "EMULATED" in out and "per-request truth" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == ["1"]]
    assert {row[1] for row in rows} >= {"structured", "code", "creative", "chat"}
    assert "windows: attributed" in out and "worst absolute error per level: c=1" in out
