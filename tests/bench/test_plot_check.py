"""--plot checks matplotlib before the bench starts anything: without it the run would
be lost to a message at its end."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from gateway.cli import main


def test_plot_without_matplotlib_stops_before_the_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    started = time.perf_counter()
    status = main(["bench", "--emulate", "--requests", "1", "--plot", f"{tmp_path}/b.png"])
    elapsed = time.perf_counter() - started
    err = capsys.readouterr().err
    assert status == 2, err
    assert "--plot needs matplotlib: pip install './tooling[bench]'" in err
    assert "EMULATED" not in err  # nothing was started
    assert elapsed < 5, elapsed


def test_plot_with_matplotlib_passes_the_check() -> None:
    from tooling.bench.plot import pyplot

    assert pyplot().get_backend().lower() == "agg"
