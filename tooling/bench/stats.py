"""Figures from raw results: per target, per workload and load, paired across targets.

Definitions (vLLM's bench where it has one):
- TTFT: request start to the first chunk carrying text; TPOT: (e2e - TTFT) /
  (completion tokens - 1); e2e: request start to the end of the stream.
- output tokens/s and requests/s: over the wall time of the target's run.
- speedup of target T: mean baseline e2e / mean T e2e over the requests both
  answered (the same request, sent to both): a ratio of means, so long
  requests weigh as much as the time they take; the geometric mean of the
  per-request ratios is kept beside it.
- oracle: per request, the faster of baseline and speculative; regret =
  gateway mean e2e / oracle mean e2e over the requests all three answered
  (1.0 = the gateway always picked the faster backend, at no cost).
- dynamic (a target of that name: ONE vLLM server with dynamic speculative
  decoding, the single-server alternative to the gateway): dynamic_regret =
  dynamic mean e2e / oracle mean e2e (requests baseline, speculative and
  dynamic answered); gateway_vs_dynamic = gateway mean e2e / dynamic mean e2e
  (requests both answered; < 1: the gateway is faster). The oracle stays
  baseline-or-speculative: it is what routing between the static pair can reach.
- acceptance: accepted / proposed draft tokens, from the speculative backend's
  counter deltas over its run ("counters", vLLM's ground truth) and from the
  per-request metrics in the final usage chunks ("per_request"); the same for
  the dynamic server from its own counters ("dynamic_counters", "dynamic_per_request").
- prefill share: mean TTFT / e2e on the baseline: the part of a request's time
  speculation cannot shorten.
- intervals: every speedup and regret above has a 95% bootstrap interval beside it
  (`speedup_ci`, `regret_ci`, ...; [lo, hi], or null under 5 paired requests),
  paired by request and seeded (tooling/bench/intervals.py). A speedup whose
  interval holds 1.0 is inconclusive.
- N routes (targets route:NAME, each a route's servers alone, and gateways): every
  static route, the gateways and the oracle over all routes, paired; speedups against
  the best static route, regret against that oracle, acceptance per route from its own
  counters: tooling/bench/routes.py (a row's "n_route").
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Any

from tooling.bench.intervals import Interval, ratio_of_sums
from tooling.bench.plan import RECORDED, Load
from tooling.bench.routes import is_n_route, n_route
from tooling.bench.runner import DYNAMIC as DYNAMIC  # re-exported beside BASE, SPEC, GATEWAY
from tooling.bench.runner import CellRun
from tooling.loadgen import Result

BASE, SPEC, GATEWAY = "baseline", "speculative", "gateway"

Key = tuple[int, int]  # (cell number, request index)


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def target_stats(results: list[Result], wall_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    e2e = [r.e2e_s for r in ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [t for r in ok if (t := r.tpot_s) is not None]
    tokens = sum(r.completion_tokens or 0 for r in ok)
    prefill = [r.ttft_s / r.e2e_s for r in ok if r.ttft_s is not None and r.e2e_s > 0]
    routes = Counter(r.route for r in ok if r.route)
    return {
        "n": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "ttft_p50_s": _r(percentile(ttft, 50), 6),
        "ttft_p95_s": _r(percentile(ttft, 95), 6),
        "tpot_p50_s": _r(percentile(tpot, 50), 6),
        "e2e_p50_s": _r(percentile(e2e, 50), 6),
        "e2e_p95_s": _r(percentile(e2e, 95), 6),
        "e2e_mean_s": _r(statistics.fmean(e2e), 6) if e2e else None,
        "output_tokens_per_s": _r(tokens / wall_s, 2) if wall_s > 0 else None,
        "requests_per_s": _r(len(ok) / wall_s, 3) if wall_s > 0 else None,
        "prompt_tokens_mean": _r(statistics.fmean(p), 1)
        if (p := [r.prompt_tokens for r in ok if r.prompt_tokens is not None])
        else None,
        "prefill_share": _r(statistics.fmean(prefill), 4) if prefill else None,
        "acceptance_per_request": _per_request_acceptance(ok),
        "routes": dict(routes) if routes else None,
    }


def _per_request_acceptance(results: Iterable[Result]) -> float | None:
    drafted = accepted = 0
    for r in results:
        if r.spec_drafted and r.spec_accepted is not None:
            drafted += r.spec_drafted
            accepted += r.spec_accepted
    return round(accepted / drafted, 4) if drafted else None


def _combine_counters(items: list[dict[str, float] | None]) -> float | None:
    got = [c for c in items if c]
    drafted = sum(c["draft_tokens"] for c in got)
    return round(sum(c["rate"] * c["draft_tokens"] for c in got) / drafted, 4) if drafted else None


def summarize(
    parts: list[tuple[int, CellRun]], workload: str | None, total_requests: int
) -> dict[str, Any]:
    """One row: these cells' results (only `workload`'s, if given), every target, paired."""
    names = list(parts[0][1].runs) if parts else []
    by_target: dict[str, dict[Key, Result]] = {n: {} for n in names}
    walls: dict[str, float] = dict.fromkeys(names, 0.0)
    for number, cell_run in parts:
        for name, run in cell_run.runs.items():
            walls[name] += run.wall_s
            for r in run.results:
                if workload is None or r.workload == workload:
                    by_target[name][(number, r.index)] = r
    n_requests = len(next(iter(by_target.values()), {}))
    row: dict[str, Any] = {
        "share": round(n_requests / total_requests, 4) if total_requests else None,
        "targets": {n: target_stats(list(by_target[n].values()), walls[n]) for n in names},
    }
    attributable = workload is None or all(c.cell.group == workload for _, c in parts)
    counters = [c.runs[SPEC].counter_acceptance for _, c in parts if SPEC in c.runs]
    gw_counters = [c.runs[GATEWAY].counter_acceptance for _, c in parts if GATEWAY in c.runs]
    row["acceptance"] = {
        "counters": _combine_counters(counters) if attributable else None,
        "per_request": row["targets"].get(SPEC, {}).get("acceptance_per_request"),
        "gateway_counters": _combine_counters(gw_counters) if attributable else None,
    }
    if DYNAMIC in names:
        dyn = [c.runs[DYNAMIC].counter_acceptance for _, c in parts if DYNAMIC in c.runs]
        own = row["targets"][DYNAMIC]["acceptance_per_request"]
        row["acceptance"]["dynamic_counters"] = _combine_counters(dyn) if attributable else None
        row["acceptance"]["dynamic_per_request"] = own
    if is_n_route(names):  # route:NAME targets: tooling/bench/routes.py
        own = {
            t: _combine_counters([c.runs[t].counter_acceptance for _, c in parts if t in c.runs])
            if attributable
            else None
            for t in names
        }
        row["n_route"] = n_route(by_target, own)
    kv = [c.spec_kv_peak for _, c in parts if c.spec_kv_peak is not None]
    row["spec_kv_peak"] = max(kv) if kv else None
    row.update(_paired(by_target))
    return row


def _ok(results: dict[Key, Result]) -> dict[Key, float]:
    return {k: r.e2e_s for k, r in results.items() if r.ok}


def _ci(num: list[float], den: list[float]) -> list[float] | None:
    """The 95% bootstrap interval of sum(num) / sum(den), paired, as JSON."""
    ci = ratio_of_sums(num, den)
    return ci.to_json() if ci is not None else None


def _paired(by_target: dict[str, dict[Key, Result]]) -> dict[str, Any]:
    out: dict[str, Any] = {"speedup": {}, "speedup_ci": {}, "speedup_geomean": {}}
    base = _ok(by_target.get(BASE, {}))
    for name, results in by_target.items():
        if name == BASE or not base:
            continue
        mine = _ok(results)
        keys = sorted(base.keys() & mine.keys())
        if keys:
            out["speedup"][name] = _r(sum(base[k] for k in keys) / sum(mine[k] for k in keys))
            out["speedup_ci"][name] = _ci([base[k] for k in keys], [mine[k] for k in keys])
            logs = [math.log(base[k] / mine[k]) for k in keys if base[k] > 0 and mine[k] > 0]
            out["speedup_geomean"][name] = _r(math.exp(statistics.fmean(logs))) if logs else None
    spec, gw = _ok(by_target.get(SPEC, {})), by_target.get(GATEWAY, {})
    keys = sorted(base.keys() & spec.keys() & _ok(gw).keys())
    out["oracle_e2e_mean_s"] = out["regret"] = out["regret_ci"] = out["oracle_agreement"] = None
    if keys:
        oracle = {k: min(base[k], spec[k]) for k in keys}
        out["oracle_e2e_mean_s"] = _r(statistics.fmean(oracle.values()), 6)
        out["regret"] = _r(sum(gw[k].e2e_s for k in keys) / sum(oracle.values()))
        out["regret_ci"] = _ci([gw[k].e2e_s for k in keys], [oracle[k] for k in keys])
        best = {k: BASE if base[k] <= spec[k] else SPEC for k in keys}
        routed = [k for k in keys if gw[k].route]
        if routed:
            agree = sum(gw[k].route == best[k] for k in routed) / len(routed)
            out["oracle_agreement"] = _r(agree, 3)
    if DYNAMIC in by_target:
        out.update(_versus_dynamic(base, spec, _ok(gw), _ok(by_target[DYNAMIC])))
    return out


def _versus_dynamic(
    base: dict[Key, float], spec: dict[Key, float], gw: dict[Key, float], dyn: dict[Key, float]
) -> dict[str, float | None]:
    """The single dynamic-SD server against the oracle and against the gateway."""
    out: dict[str, Any] = dict.fromkeys(
        ("dynamic_regret", "dynamic_regret_ci", "gateway_vs_dynamic", "gateway_vs_dynamic_ci")
    )
    keys = sorted(base.keys() & spec.keys() & dyn.keys())
    if keys:
        oracle = [min(base[k], spec[k]) for k in keys]
        out["dynamic_regret"] = _r(sum(dyn[k] for k in keys) / sum(oracle))
        out["dynamic_regret_ci"] = _ci([dyn[k] for k in keys], oracle)
    keys = sorted(gw.keys() & dyn.keys())
    if keys:
        out["gateway_vs_dynamic"] = _r(sum(gw[k] for k in keys) / sum(dyn[k] for k in keys))
        out["gateway_vs_dynamic_ci"] = _ci([gw[k] for k in keys], [dyn[k] for k in keys])
    return out


def speedup_interval(row: dict[str, Any], name: str) -> Interval | None:
    """A row's speedup interval for target `name` (None: too few requests, or an older
    bench JSON without intervals)."""
    return Interval.of((row.get("speedup_ci") or {}).get(name))


def rows(cell_runs: list[CellRun]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per (load, workload) rows, and one overall row per load."""
    loads: list[Load] = []
    for c in cell_runs:
        if c.cell.load not in loads:
            loads.append(c.cell.load)
    per_workload, overall = [], []
    for load in loads:
        parts = [(i, c) for i, c in enumerate(cell_runs) if c.cell.load == load]
        names: list[str] = []
        total = 0
        for _, c in parts:
            first = next(iter(c.runs.values()), None)
            for r in first.results if first else ():
                total += 1
                if r.workload not in names:
                    names.append(r.workload)
        for name in names:
            mine = [(i, c) for i, c in parts if c.cell.group in (name, RECORDED)]
            per_workload.append(
                {"load": load.to_json(), "workload": name, **summarize(mine, name, total)}
            )
        overall.append({"load": load.to_json(), "workload": "all", **summarize(parts, None, total)})
    return per_workload, overall


def overall_regret(cell_runs: list[CellRun]) -> float | None:
    """Regret over the whole run: every load and workload together."""
    return whole_run(cell_runs).get("regret")


def whole_run(cell_runs: list[CellRun]) -> dict[str, Any]:
    """The paired figures (regret, gateway_vs_dynamic, ...) over every load and workload."""
    parts = list(enumerate(cell_runs))
    return summarize(parts, None, 0) if parts else {}
