"""A short soak with every event of issue 16 injected once: no failed request, no
stream without [DONE], flat tasks and RSS, no ResourceWarning."""

from __future__ import annotations

import json

from benchrun import run_benchmark


def test_soak_smoke() -> None:
    proc = run_benchmark("soak.py", "--duration", "20", "--concurrency", "8", timeout=110)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert summary["ok"] and summary["failed"] == 0 and summary["bad_streams"] == 0
    assert summary["requests"] > 100
    # One round of events: kill each backend, stall, eject then kill the other, saturate, flood.
    assert summary["events"] >= 7
    for figure in ("backend kills+restarts", "ejections", "saturated queues", "floods of 4 MB"):
        assert figure in proc.stdout
