"""The adaptation benchmark runs end to end on its smoke subset and prints its table: every
scenario's row, over HTTP (a real gateway over the emulator) and in virtual time, the
acceptance it learned, and the misses. No figure is asserted: a few requests on a shared
CI machine say nothing about speed (the README has the full table)."""

from __future__ import annotations

import pytest
from benchrun import run_benchmark

SMOKE = ("default", "inverted", "non-stream")


@pytest.mark.slow
@pytest.mark.serial  # 52 s alone, 173-180 s of its 180 s limit beside the parallel run
@pytest.mark.timeout(200)
def test_adaptation_benchmark_smoke() -> None:
    proc = run_benchmark("adaptation.py", "--smoke", timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "EMULATED" in out and "NOT GPU measurements" in out
    assert "told only the two URLs and k" in out  # what the gateway was told, stated
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line[:1].isalpha()}
    for name in SMOKE:
        assert name in rows, out
        assert rows[name][1] == "4"  # k as told
        float(rows[name][2].rstrip("!"))  # the regret at concurrency 1, over HTTP
    # Over HTTP and in virtual time for a truth the emulator models; over HTTP only for
    # what the gateway measures over HTTP (virtual time has no HTTP).
    assert rows["default"].count("|") == 1 and "-" not in rows["default"][:12]
    assert rows["non-stream"][rows["non-stream"].index("|") + 1] == "-"
    assert "acceptance a after the c=1 run" in out and "misses:" in out
    # Each scenario's gateway had its start-up profile in before the timed requests.
    profiles = out.split("start-up profile over HTTP, per scenario:")[1].split("\n\n")[0]
    assert profiles.count("tokens per speculative step") == len(SMOKE), profiles
    assert "[EMULATED] 3 scenarios" in out
