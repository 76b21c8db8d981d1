"""Facts per workload, from a bench JSON or an outcome log, and the verdict they imply.

The talk's checklist for turning speculative decoding on: is the output
structured (predictable, drafts accepted)? is there spare memory (the draft's
weights and KV)? are batches small (spare compute for the draft)? is the
context short (prefill, which speculation does not shorten, is a small part
of the time)? The verdict answers those from measurements: the speedup at
the observed concurrency decides, and the reason names the checklist item
that explains it.

From a bench: the speedup is measured (paired requests, speculative vs
baseline). From an outcome log, only one route answered each request, so the
speedup is estimated: from the time per output token of the two routes when
both have enough requests of the workload (the gateway's exploration sends
some each way), else modelled from the measured acceptance with Leviathan's
formula; and the prefill share turns a decode speedup into an e2e one.

Every speedup carries its 95% bootstrap interval (tooling/bench/intervals.py):
from a bench, the one the bench computed (paired by request); from an outcome
log, one drawn here by resampling the workload's requests (each route's on its
own). A verdict is given only where the interval excludes 1.0: one that holds it,
or a workload with too few requests for an interval, is INCONCLUSIVE, and says
how many requests it rests on. One exception: an interval that holds 1.0 but
stays under SPECULATE_MIN (0.93-1.04, say) is a DON'T all the same, as no end of
it would pay for the draft. (A bench JSON from before intervals has none: its
verdicts say so and stand on the point figures alone.)
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from classifier.speculation import alpha_from_rate, decode_speedup
from tooling.bench.intervals import Interval, conclusion, resampled
from tooling.bench.stats import speedup_interval

SPECULATE_MIN = 1.10  # below: not worth the draft's memory and the risk
LOW_ACCEPTANCE = 0.35
PREFILL_BOUND = 0.5
MIN_SAMPLES = 3


@dataclass(slots=True)
class Facts:
    workload: str
    share: float
    acceptance: float | None
    speedups: list[tuple[str, float | None]]  # (load label, speedup), in load order
    speedup_source: str
    prefill_share: float | None
    structured: bool
    prompt_tokens: float | None = None
    concurrency: float | None = None
    gateway_speedup: float | None = None
    at: str = ""  # the load the verdict is for (default: the first)
    verdict: str = ""
    speculate: bool = False
    # per load, like speedups: each speedup's 95% interval (None: too few requests)
    intervals: list[tuple[str, Interval | None]] = field(default_factory=list)
    gateway_interval: Interval | None = None
    requests: int | None = None  # what the figures at `at` rest on
    # False for a bench JSON from before intervals: its verdicts stand on the points
    has_intervals: bool = True
    inconclusive: bool = False

    @property
    def speedup(self) -> float | None:
        return dict(self.speedups).get(self.at_label)

    @property
    def interval(self) -> Interval | None:
        return dict(self.intervals).get(self.at_label)

    @property
    def at_label(self) -> str:
        return self.at or (self.speedups[0][0] if self.speedups else "?")


def speedup_text(value: float | None, ci: Interval | None, has_intervals: bool = True) -> str:
    """`1.38x [1.26-1.49]`; `1.38x [n<5]` where too few requests gave no interval."""
    if value is None:
        return "-"
    if not has_intervals:
        return f"{value:.2f}x"
    return f"{value:.2f}x [{ci.lo:.2f}-{ci.hi:.2f}]" if ci else f"{value:.2f}x [n<5]"


def decide(f: Facts) -> Facts:
    """Fill in verdict and speculate; the reason is the first checklist item that explains it.
    No verdict where the speedup's interval holds 1.0 or there is none: INCONCLUSIVE; but an
    interval that holds 1.0 and stays under SPECULATE_MIN is a DON'T (neither end pays)."""
    s, a, p = f.speedup, f.acceptance, f.prefill_share
    at = f.at_label
    others = [x for x in f.speedups if x[0] != at and x[1] is not None]
    if s is None:
        f.verdict = "no verdict: no speculative measurement for this workload"
        return f
    measured = speedup_text(s, f.interval, f.has_intervals)
    n = f"{f.requests} requests" if f.requests is not None else "the requests"
    ci = f.interval
    small = ci is not None and ci.hi < SPECULATE_MIN
    if f.has_intervals and conclusion(ci) == "inconclusive" and not small:
        f.inconclusive = True
        why_not = (
            "its 95% interval holds 1.0"
            if f.interval is not None
            else "too few requests for an interval"
        )
        f.verdict = (
            f"INCONCLUSIVE: {measured} at {at} from {n}: {why_not}, so they cannot tell "
            "faster from slower; measure more"
        )
        return f
    if not f.has_intervals:
        measured += " (no interval: a bench JSON from before intervals)"
    elif conclusion(ci) == "inconclusive":
        measured += f" (faster or slower: unknown; under {SPECULATE_MIN:.2f}x either way)"
    why = []
    if f.structured:
        why.append("structured output")
    if a is not None:
        why.append(f"{a:.0%} of drafts accepted")
    if s >= SPECULATE_MIN and not small:
        f.speculate = True
        worst = min(others, key=lambda x: x[1] or 0.0) if others else None
        flip = f"; but {worst[1]:.2f}x at {worst[0]}" if worst and (worst[1] or 0) < 1.0 else ""
        f.verdict = f"SPECULATE: {', '.join(why)}; {measured} at {at}{flip}"
        return f
    if p is not None and p >= PREFILL_BOUND:
        reason = (
            f"prefill-bound: {p:.0%} of the time is prefill, which speculation does not shorten"
        )
    elif a is not None and a < LOW_ACCEPTANCE:
        reason = f"drafts mostly rejected ({a:.0%} accepted)"
    elif any((x[1] or 0.0) >= SPECULATE_MIN for x in others):
        reason = f"batch too large at {at}: no spare compute for the draft"
    elif s >= 1.0:
        reason = f"gain too small to pay for the draft's memory ({', '.join(why) or 'measured'})"
    else:
        reason = f"slower ({', '.join(why) or 'measured'})"
    f.verdict = f"DON'T: {reason}; {measured} at {at}"
    return f


def from_bench(doc: dict[str, Any], load_label: str | None) -> tuple[list[Facts], Facts]:
    """Per-workload facts at `load_label` (default: the lowest load), and the overall row."""
    labels = [r["load"]["label"] for r in doc["overall"]]
    if not labels:
        raise ValueError("the bench JSON has no finished cells")
    chosen: str = load_label if load_label in labels and load_label else labels[0]

    def facts(rows: list[dict[str, Any]], name: str) -> Facts:
        by_load = {r["load"]["label"]: r for r in rows}
        row = by_load.get(chosen) or next(iter(by_load.values()))
        acc = row["acceptance"]
        base = row["targets"].get("baseline", {})
        spec = row["targets"].get("speculative", {})
        return decide(
            Facts(
                workload=name,
                share=row.get("share") or 0.0,
                acceptance=acc["counters"] if acc["counters"] is not None else acc["per_request"],
                speedups=[
                    (x, by_load[x]["speedup"].get("speculative")) for x in labels if x in by_load
                ],
                intervals=[
                    (x, speedup_interval(by_load[x], "speculative")) for x in labels if x in by_load
                ],
                has_intervals="intervals" in doc,
                requests=min(base.get("ok", 0), spec.get("ok", 0)) if base and spec else None,
                gateway_interval=speedup_interval(row, "gateway"),
                at=chosen,
                speedup_source="measured (paired requests)",
                prefill_share=base.get("prefill_share"),
                structured=name == "structured",
                prompt_tokens=base.get("prompt_tokens_mean"),
                concurrency=row["load"]["value"] if row["load"]["kind"] == "concurrency" else None,
                gateway_speedup=row["speedup"].get("gateway"),
            )
        )

    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in doc["rows"]:
        grouped[r["workload"]].append(r)
    per = [facts(rows, name) for name, rows in grouped.items()]
    overall = facts(doc["overall"], "overall")
    overall.structured = False
    return per, overall


def from_outcomes(records: list[dict[str, Any]], k: int, c: float) -> tuple[list[Facts], Facts]:
    """Per-workload facts from outcome log records (successful ones only)."""
    ok = [r for r in records if r.get("status") == "2xx" and isinstance(r.get("features"), dict)]
    if not ok:
        raise ValueError("the outcome log has no successful requests")
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in ok:
        grouped[str(r["features"].get("workload"))].append(r)
    per = [_outcome_facts(name, rs, len(ok), k, c) for name, rs in grouped.items()]
    overall = _outcome_facts("overall", ok, len(ok), k, c)
    overall.structured = False
    return per, overall


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _tpot(r: dict[str, Any]) -> float | None:
    n, ttft, dur = r.get("completion_tokens"), r.get("ttft_s"), r.get("duration_s")
    if not isinstance(n, int) or n < 2 or ttft is None or dur is None:
        return None
    return float(dur - ttft) / (n - 1)


def _outcome_facts(name: str, rs: list[dict[str, Any]], total: int, k: int, c: float) -> Facts:
    spec = [r for r in rs if r.get("route") == "speculative"]
    weights = [
        (r["acceptance"], r.get("completion_tokens") or 1)
        for r in spec
        if r.get("acceptance") is not None
    ]
    acceptance = sum(a * w for a, w in weights) / sum(w for _, w in weights) if weights else None
    prefills = [
        r["ttft_s"] / r["duration_s"]
        for r in rs
        if r.get("ttft_s") is not None and r.get("duration_s")
    ]
    prefill = _median(prefills)
    tpots = {
        route: [t for r in rs if r.get("route") == route and (t := _tpot(r)) is not None]
        for route in ("speculative", "baseline")
    }

    def e2e(decode: float, p: float | None) -> float:
        p = p or 0.0
        return 1.0 / (p + (1.0 - p) / decode)

    decode, source, interval = None, "unknown", None
    if all(len(v) >= MIN_SAMPLES for v in tpots.values()):
        decode = statistics.median(tpots["baseline"]) / statistics.median(tpots["speculative"])
        source = "estimated from both routes' time per output token"
        interval = _interval(
            [tpots["baseline"], tpots["speculative"]],
            prefills,
            lambda d: float(np.median(d[0]) / np.median(d[1])),
            e2e,
        )
    elif acceptance is not None:
        decode = decode_speedup(alpha_from_rate(acceptance, k), k, c)
        source = f"modelled from acceptance (k={k}, c={c:g})"

        def modelled(d: list[npt.NDArray[np.float64]]) -> float:
            rate = float(np.average(d[0][:, 0], weights=d[0][:, 1]))
            return decode_speedup(alpha_from_rate(rate, k), k, c)

        interval = _interval([[list(w) for w in weights]], prefills, modelled, e2e)
    speedup = e2e(decode, prefill) if decode is not None else None
    batch = _median([float(r["batch"]) for r in rs if isinstance(r.get("batch"), int | float)])
    label = f"c~{batch:g}" if batch is not None else "observed load"
    structured = sum(bool(r["features"].get("structured")) for r in rs) > len(rs) / 2
    return decide(
        Facts(
            workload=name,
            share=len(rs) / total,
            acceptance=acceptance,
            speedups=[(label, speedup)],
            intervals=[(label, interval)],
            requests=len(rs),
            speedup_source=source,
            prefill_share=prefill,
            structured=structured,
            prompt_tokens=_median([float(r["features"]["prompt_tokens"]) for r in rs]),
            concurrency=batch,
        )
    )


def _interval(
    samples: list[Any],
    prefills: list[float],
    decode: Callable[[list[npt.NDArray[np.float64]]], float],
    e2e: Callable[[float, float | None], float],
) -> Interval | None:
    """An outcome log's speedup interval: the workload's requests drawn again (each
    sample on its own), the decode speedup and the prefill share taken anew each time."""
    if prefills:
        samples = [*samples, prefills]

    def statistic(drawn: list[npt.NDArray[np.float64]]) -> float | None:
        d = decode(drawn)
        p = float(np.median(drawn[-1])) if prefills else None
        return e2e(d, p) if d > 0 else None

    return resampled(samples, statistic, resamples=1000)
