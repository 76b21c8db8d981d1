"""The real-engine trio on this machine's CPU cores, started by deploy/cpu/up.sh:
routes "none" (the baseline), "ngram-k4" (the speculative server) and "ngram-k2"."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def start_trio(run_dir: Path, *up_args: str) -> dict[str, str]:
    """Start the trio with its logs in `run_dir`; route name -> URL. Stop it with
    `stop_trio(run_dir)`, also when this raises (up.sh stops what it started then)."""
    up = [str(ROOT / "deploy/cpu/up.sh"), "--ngram-k2", "--run-dir", str(run_dir), *up_args]
    lines = subprocess.run(["bash", *up], check=True, text=True, stdout=subprocess.PIPE).stdout
    pair = dict(line.split("=", 1) for line in lines.split() if "=" in line)
    k2 = (run_dir / "ngram-k2").read_text().strip().split("=", 1)[1]
    return {"none": pair["baseline"], "ngram-k4": pair["speculative"], "ngram-k2": k2}


def stop_trio(run_dir: Path) -> None:
    subprocess.run(
        ["bash", str(ROOT / "deploy/cpu/down.sh"), "--run-dir", str(run_dir)], check=False
    )
