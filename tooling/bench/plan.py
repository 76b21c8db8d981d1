"""What a bench sends, and when: request sets, load levels and arrival times.

Built-in workloads run one cell per workload and load level, so the speculative
backend's counters (which know nothing of workloads) can be attributed to one
workload. A recorded or hand-written JSONL runs as one cell per load level,
mixed as it came, and its rows are split by workload afterwards. Every target
of a cell gets the same request list and the same arrival times, so results
pair request by request.

Loads: a fixed concurrency (closed loop), a Poisson rate (open loop, seeded
exponential gaps) or the recording's own arrival times (open loop, gaps
multiplied by --time-scale).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from classifier.features import Endpoint, extract_features
from classifier.tokens import TokenCounter
from tooling.workloads import BUILTIN, MIXES, Request, build

RECORDED = "recorded"
# With --duration, a cell's request list is at most this long, cut at the deadline.
DURATION_CAP = 1000


@dataclass(frozen=True, slots=True)
class Load:
    kind: str  # "concurrency" | "rate" | "replay"
    value: float  # requests in flight | requests per second | time scale

    @property
    def label(self) -> str:
        if self.kind == "concurrency":
            return f"c={int(self.value)}"
        if self.kind == "rate":
            return f"rate={self.value:g}/s"
        return f"replay x{self.value:g}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value, "label": self.label}


@dataclass(frozen=True, slots=True)
class Cell:
    load: Load
    group: str  # a workload name, or "recorded" for a JSONL run as one mix
    requests: list[Request]
    offsets_s: list[float] | None  # arrival times (open loop); None: closed loop


def parse_list(text: str, kind: type[float] | type[int], flag: str) -> list[float]:
    try:
        values = [float(kind(v)) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"{flag}: values must be > 0")
    return values


def is_file(workload: str) -> bool:
    return workload.endswith((".jsonl", ".json")) or Path(workload).is_file()


def builtin_names(workload: str) -> list[str]:
    names = MIXES.get(workload) or [w.strip() for w in workload.split(",") if w.strip()]
    unknown = [n for n in names if n not in BUILTIN]
    if unknown:
        choices = ", ".join([*MIXES, *BUILTIN])
        raise ValueError(f"--workload: unknown {', '.join(unknown)}; choose from {choices}")
    return names


def load_jsonl(path: Path, counter: TokenCounter) -> list[Request]:
    """Recorder lines ({"t", "endpoint", "workload", "body"}) or bare request bodies."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
        if not isinstance(item, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object")
        body = item["body"] if isinstance(item.get("body"), dict) else item
        endpoint = item.get("endpoint") or ("chat" if "messages" in body else "completions")
        if endpoint not in ("chat", "completions"):
            raise ValueError(f"{path}:{number}: endpoint must be chat or completions")
        workload = item.get("workload")
        if not isinstance(workload, str):
            workload = extract_features(body, Endpoint(endpoint), counter).workload.value
        at = item.get("t")
        out.append(
            Request(workload, endpoint, body, float(at) if isinstance(at, int | float) else None)
        )
    if not out:
        raise ValueError(f"{path}: no requests")
    return out


def with_model(requests: list[Request], model: str | None) -> list[Request]:
    if model is None:
        return requests
    return [Request(r.workload, r.endpoint, {**r.body, "model": model}, r.at_s) for r in requests]


def poisson_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Arrival times of a Poisson process at `rate`/s, the same for the same seed."""
    rng = random.Random(f"poisson:{seed}:{rate}")
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def replay_offsets(requests: list[Request], time_scale: float) -> list[float]:
    """The recording's arrival times, from the first request, gaps times `time_scale`."""
    if any(r.at_s is None for r in requests):
        raise ValueError("--replay-timing needs recorded arrival times ('t' on every line)")
    first = min(r.at_s for r in requests if r.at_s is not None)
    return [((r.at_s or 0.0) - first) * time_scale for r in requests]


def cells(
    *,
    workload: str,
    loads: list[Load],
    requests: int | None,
    duration_s: float | None,
    seed: int,
    model: str | None,
    counter: TokenCounter | None,
) -> list[Cell]:
    """Every cell of the run, in the order they run: load level, then workload."""
    out: list[Cell] = []
    if is_file(workload):
        if counter is None:
            raise ValueError("a JSONL workload needs a token counter to label its requests")
        recorded = load_jsonl(Path(workload), counter)
        if duration_s is not None:
            recorded = recorded * (DURATION_CAP // len(recorded) + 1)
        if requests is not None:
            recorded = recorded[:requests]
        recorded = with_model(recorded, model)
        for load in loads:
            out.append(Cell(load, RECORDED, recorded, _offsets(load, recorded, seed)))
        return out
    for load in loads:
        count = requests or default_requests(load)
        if duration_s is not None:
            count = _timed_requests(load, duration_s)
        for name in builtin_names(workload):
            reqs = build([name], count, model=model, seed=seed)
            out.append(Cell(load, name, reqs, _offsets(load, reqs, seed)))
    return out


def default_requests(load: Load) -> int:
    """Enough requests for a cell to reach its load: 8, or two waves at high concurrency."""
    if load.kind == "concurrency":
        return max(8, 2 * int(load.value))
    return 16


def _timed_requests(load: Load, duration_s: float) -> int:
    """Enough for `duration_s` at this load (a rate needs about rate x duration)."""
    if load.kind == "rate":
        return min(DURATION_CAP, int(load.value * duration_s * 2) + 16)
    return DURATION_CAP


def _offsets(load: Load, requests: list[Request], seed: int) -> list[float] | None:
    if load.kind == "concurrency":
        return None
    if load.kind == "rate":
        return poisson_offsets(len(requests), load.value, seed)
    return replay_offsets(requests, load.value)
