"""The bench's two outputs: the JSON document (for machines) and the table (for people).

JSON schema ("schema": "specroute-bench/1"), everything a later `advise` needs:

    {
      "schema": "specroute-bench/1",
      "emulated": bool,            # any target is, or sits in front of, the emulator
      "started": ISO-8601 UTC, "duration_s": float, "complete": bool (false: interrupted),
      "command": [argv...],
      "workload": str,             # --workload as given (a mix, names, or a JSONL path)
      "mode": "concurrency" | "rate" | "replay",
      "concurrency": [int] | null, "rates": [float] | null, "time_scale": float | null,
      "requests_per_cell": int | null, "duration_per_cell_s": float | null, "seed": int,
      "targets": {NAME: {"name", "url", "model", "kind", "emulated", "version",
                         "cache_config": {vllm:cache_config_info labels} | null, "problems"}},
      "rows": [ROW...],            # one per (load, workload)
      "overall": [ROW...],         # one per load, workload "all"
      "regret": float | null,      # gateway / oracle mean e2e over the whole run
      "regret_ci": CI,
      "gateway_vs_dynamic", "dynamic_regret": float | null,  # only with a "dynamic" target
      "gateway_vs_dynamic_ci", "dynamic_regret_ci": CI,       # likewise
      "intervals": {"method", "level", "resamples", "seed", "min_pairs"},
      "cells": [{"load": LOAD, "group": str, "spec_kv_peak": float | null,
                 "runs": {NAME: {"wall_s", "counter_acceptance": ACC | null,
                                 "results": [{"index", "workload", "ok", "status", "e2e_s",
                                              "ttft_s", "prompt_tokens", "completion_tokens",
                                              "route"?, "reason"?, "spec_drafted"?,
                                              "spec_accepted"?, "error"?}]}}}]
    }
    LOAD = {"kind": "concurrency" | "rate" | "replay", "value": float, "label": str}
    ACC  = {"rate": accepted/proposed, "mean_length": tokens per verify step, "draft_tokens"}
    CI   = [lo, hi]: the 95% bootstrap interval (paired by request, seeded), or null under
           5 paired requests; a speedup whose interval holds 1.0 is inconclusive
    ROW  = {"load": LOAD, "workload": str, "share": float,
            "targets": {NAME: {"n", "ok", "errors", "ttft_p50_s", "ttft_p95_s", "tpot_p50_s",
                               "e2e_p50_s", "e2e_p95_s", "e2e_mean_s", "output_tokens_per_s",
                               "requests_per_s", "prompt_tokens_mean", "prefill_share",
                               "acceptance_per_request", "routes": {route: n} | null}},
            "acceptance": {"counters", "per_request", "gateway_counters",  # floats or null
                           "dynamic_counters"?, "dynamic_per_request"?},
            "spec_kv_peak": float | null,
            "speedup": {NAME: baseline/NAME mean e2e, paired}, "speedup_ci": {NAME: CI},
            "speedup_geomean": {...},
            "oracle_e2e_mean_s": float | null, "regret": float | null, "regret_ci": CI,
            "oracle_agreement": share of gateway routes that were the faster one | null,
            "dynamic_regret"?: dynamic / oracle mean e2e | null, "dynamic_regret_ci"?: CI,
            "gateway_vs_dynamic"?: gateway / dynamic mean e2e | null,
            "gateway_vs_dynamic_ci"?: CI,
            "n_route"?: NROUTE | null}
    NROUTE (only with route:NAME targets; definitions in tooling/bench/routes.py; also
    the whole run's as the document's "n_route") =
           {"routes": [target...], "gateways": [target...], "n": paired requests,
            "acceptance": {route target: {"counters", "per_request"}},
            "e2e_mean_s": {target: s}, "best_static": target, "oracle_e2e_mean_s",
            "oracle_picks": {route target: requests it was the fastest on},
            "best_pair": [target, target], "pair_oracle_e2e_mean_s", "oracle_gain_over_pair",
            "speedup_vs_best": {target: x}, "speedup_vs_best_ci": {target: CI},
            "regret": {gateway: x}, "regret_ci": {gateway: CI}, "capture": {gateway: x | null},
            "oracle_agreement": {gateway: share | null}}
    ("?": only when a target is named "dynamic": one server with dynamic speculative
    decoding, benched beside the pair it would replace; the oracle stays the faster of
    baseline and speculative per request.)

Definitions: tooling/bench/stats.py.
"""

from __future__ import annotations

from typing import Any

from tooling.bench.intervals import Interval, conclusion
from tooling.bench.routes import is_n_route
from tooling.bench.routes import table as routes_table
from tooling.bench.stats import BASE, DYNAMIC, GATEWAY, SPEC, speedup_interval

SCHEMA = "specroute-bench/1"
EMULATED_NOTE = (
    "EMULATED backends (specroute's emulated vLLM: vLLM's API and metrics, modelled "
    "GPU timing, no model runs): these figures are NOT real GPU measurements"
)


def header(doc: dict[str, Any]) -> str:
    lines = [
        f"specroute bench: {EMULATED_NOTE}" if doc["emulated"] else "specroute bench",
        "targets:",
    ]
    for info in doc["targets"].values():
        kind = info["kind"].upper() if info["emulated"] else info["kind"]
        if info["kind"] == "specroute gateway":
            kind += " (over EMULATED backends)" if info["emulated"] else ""
        extra = [f"model {info['model'] or '?'}"]
        if info.get("engine"):
            extra.append(info["engine"])
        if info.get("version"):
            extra.append(f"version {info['version']}")
        extra += info.get("problems") or []
        lines.append(f"  {info['name']:<12} {info['url']:<28} {kind}; {', '.join(extra)}")
    loads = ", ".join(r["load"]["label"] for r in doc["overall"]) or "-"
    sent = ", ".join(
        f"{r['load']['label']}: {next(iter(r['targets'].values()))['n']}" for r in doc["overall"]
    )
    count = f"requests per target {sent}"
    if doc["duration_per_cell_s"]:
        count = f"{doc['duration_per_cell_s']:g} s per cell and target ({count})"
    lines.append(f"workload {doc['workload']}; loads {loads}; {count}")
    return "\n".join(lines)


W = 6  # width of one target's column


def _f(value: float | None, fmt: str, width: int = W, scale: float = 1.0) -> str:
    """Right-aligned in `width` with a space before it: fewer decimals if it would not fit."""
    if value is None:
        return f"{'-':>{width}}"
    decimals = int(fmt[1]) if fmt[1:2].isdigit() else 0
    for d in range(decimals, -1, -1):
        text = f"{value * scale:.{d}f}"
        if len(text) < width:
            break
    return f"{text:>{width}}"


def _x(value: float | None, ci: Interval | None = None, width: int = 8) -> str:
    """A speedup, with `?` after it when its interval holds 1.0 (or there is none)."""
    if value is None:
        return f"{'-':>{width}}"
    mark = "?" if conclusion(ci) == "inconclusive" else " "
    return f"{value:>{width - 2}.2f}x{mark}"


def with_interval(value: float | None, ci: Interval | None, *, speedup: bool) -> str:
    """`1.52x [1.41-1.63]` for a speedup, `1.020 [1.005-1.041]` for a regret (or any
    ratio where 1.0 is the mark); `[no interval]` under 5 paired requests."""
    if value is None:
        return "-"
    point = f"{value:.2f}x" if speedup else f"{value:.3f}"
    if ci is None:
        return f"{point} [no interval]"
    d = 2 if speedup else 3
    return f"{point} [{ci.lo:.{d}f}-{ci.hi:.{d}f}]"


def table(doc: dict[str, Any]) -> str:
    """Per load: one line per workload and an `all` line; the paired figures at the right.

    With a "dynamic" target, its acceptance and gateway/dynamic join each line, and a
    second table sets mean e2e of every target beside the oracle's.
    """
    names = list(doc["targets"])
    if is_n_route(names):  # route:NAME targets: every route, the gateways, the oracles
        return routes_table(doc) + _whole_n_route(doc)
    dynamic = DYNAMIC in names
    others = [n for n in names if n != BASE]
    cols = "".join(f"{_short(n):>{W}}" for n in names)
    span = W * len(names)
    sw = 8  # a speedup column
    accept, accept_cols = (f"{'accept':^17}", f"{'ctr':>5} {'req':>5} {'dyn':>5}")
    if not dynamic:
        accept, accept_cols = f"{'accept':^11}", f"{'ctr':>5} {'req':>5}"
    gw_dyn = f" {'gw/dyn':>6}" if dynamic else ""
    first = (
        f"{'':<17} {'e2e mean (s)':^{span}} {'e2e p50 (s)':^{span}} {'TTFT p50 (ms)':^{span}} "
        f"{'TPOT p50 (ms)':^{span}} {'out tok/s':^{span}} {accept} "
        f"{'speedup':^{sw * len(others)}} {'regret':>6}{gw_dyn}  gw routes"
    )
    second = (
        f"{'workload':<13}{'n':>4} {cols} {cols} {cols} {cols} {cols} {accept_cols} "
        + "".join(f"{_short(n):>{sw - 1}} " for n in others)
        + f" {'':>6}{' ' * len(gw_dyn)}  {'spec/base'}"
    )
    out = []
    for overall in doc["overall"]:
        label = overall["load"]["label"]
        rows = [r for r in doc["rows"] if r["load"]["label"] == label]
        out += ["", f"== {label} ==", first, second]
        out += [_line(row, names, others) for row in rows]
        out.append(_line(overall, names, others))
        out += ["", *intervals([*rows, overall], others)]
    out.append("")
    out.append(
        "speedup = baseline mean e2e / target mean e2e, paired per request (higher is "
        "better); accept = accepted/proposed draft tokens (ctr: vLLM counters, req: "
        "per-request metrics)"
    )
    out.append(
        "regret = gateway mean e2e / oracle mean e2e (oracle: the faster backend per request; "
        "1.0 is the best)"
    )
    out.append(
        "[lo-hi]: 95% bootstrap interval, paired by request (2000 resamples, seeded; none "
        "under 5 requests); ?/inconclusive: the interval holds 1.0, so the requests cannot "
        "tell faster from slower"
    )
    if dynamic:
        out.append(
            "dynamic = ONE vLLM server with dynamic speculative decoding (K per batch size), "
            "on its own GPU; dyn = its counters' acceptance; gw/dyn = gateway mean e2e / "
            "dynamic mean e2e, paired (< 1: the gateway is faster)"
        )
    if any(s["errors"] for r in doc["overall"] for s in r["targets"].values()):
        out.append("n!E: n requests, E of them failed (their errors are in the JSON)")
    regret = doc.get("regret")
    if regret is not None:
        whole = with_interval(regret, Interval.of(doc.get("regret_ci")), speedup=False)
        out.append(f"gateway/oracle regret over the whole run: {whole}")
    if dynamic:
        out += ["", *versus_dynamic(doc)]
    return "\n".join(out)


def _whole_n_route(doc: dict[str, Any]) -> str:
    """The N-route figures over the whole run: each gateway's regret and capture."""
    whole = doc.get("n_route") or {}
    if "regret" not in whole:
        return ""
    lines = [""]
    for g in whole["gateways"]:
        regret = with_interval(
            whole["regret"][g], Interval.of(whole["regret_ci"].get(g)), speedup=False
        )
        capture = whole["capture"].get(g)
        lines.append(
            f"{g}/oracle regret over the whole run: {regret}; capture "
            f"{'-' if capture is None else f'{capture:.2f}'} (n = {whole['n']}, "
            f"best static {whole['best_static']})"
        )
    return "\n".join(lines)


def _short(name: str) -> str:
    return {BASE: "base", SPEC: "spec", GATEWAY: "gw", DYNAMIC: "dyn"}.get(name, name[:5])


def _line(row: dict[str, Any], names: list[str], others: list[str]) -> str:
    t = row["targets"]
    n = t[names[0]]["n"] if names else 0
    errors = sum(s["errors"] for s in t.values())
    mean = "".join(_f(t[x]["e2e_mean_s"], ".3f") for x in names)
    e2e = "".join(_f(t[x]["e2e_p50_s"], ".3f") for x in names)
    ttft = "".join(_f(t[x]["ttft_p50_s"], ".0f", scale=1000) for x in names)
    tpot = "".join(_f(t[x]["tpot_p50_s"], ".1f", scale=1000) for x in names)
    tps = "".join(_f(t[x]["output_tokens_per_s"], ".0f") for x in names)
    acc = row["acceptance"]
    accept = f"{_f(acc['counters'], '.2f', 5)} {_f(acc['per_request'], '.2f', 5)}"
    if DYNAMIC in t:
        accept += f" {_f(acc.get('dynamic_counters'), '.2f', 5)}"
    speed = "".join(_x(row["speedup"].get(x), speedup_interval(row, x)) for x in others)
    gw_dyn = _f(row.get("gateway_vs_dynamic"), ".3f", 7) if DYNAMIC in t else ""
    routes = (t.get(GATEWAY) or {}).get("routes") or {}
    route = f"{routes.get(SPEC, 0)}/{routes.get(BASE, 0)}" if GATEWAY in t else ""
    count = f"{n}" if not errors else f"{n}!{errors}"
    return (
        f"{row['workload']:<13}{count:>4} {mean} {e2e} {ttft} {tpot} {tps} {accept} {speed} "
        f"{_f(row['regret'], '.3f')}{gw_dyn}  {route}"
    )


def intervals(rows: list[dict[str, Any]], others: list[str]) -> list[str]:
    """One load's speedups and regret with their intervals, and what each concludes."""
    sw = 32
    head = f"  {'95% intervals':<13}{'n':>4}  "
    head += "".join(f"{_short(x) + ' speedup':<{sw}}" for x in others)
    out = [head + "regret (gateway / oracle)"]
    for row in rows:
        n = next(iter(row["targets"].values()))["n"] if row["targets"] else 0
        cells = []
        for x in others:
            value, ci = row["speedup"].get(x), speedup_interval(row, x)
            word = conclusion(ci) if value is not None else ""
            cells.append(f"{with_interval(value, ci, speedup=True) + ' ' + word:<{sw}}")
        regret = with_interval(row["regret"], Interval.of(row.get("regret_ci")), speedup=False)
        out.append(f"  {row['workload']:<13}{n:>4}  " + "".join(cells) + regret)
    return out


def versus_dynamic(doc: dict[str, Any]) -> list[str]:
    """Mean e2e of every target beside the oracle's, and the ratios that compare them."""
    names = [n for n in (BASE, SPEC, DYNAMIC, GATEWAY) if n in doc["targets"]]
    cols = "".join(f"{_short(n):>{W + 1}}" for n in names)
    out = [
        "the gateway vs one server with dynamic speculative decoding (mean e2e, s; "
        "oracle = faster of baseline and speculative per request)",
        f"{'load':<8}{'workload':<12}{'n':>4} {cols} {'oracle':>7}  "
        f"{'dyn/orc':<21}{'gw/orc':<21}gw/dyn",
    ]

    def ratio(row: dict[str, Any], key: str) -> str:
        value, ci = row.get(key), Interval.of(row.get(f"{key}_ci"))
        return f"{with_interval(value, ci, speedup=False):<21}"

    for overall in doc["overall"]:
        label = overall["load"]["label"]
        for row in [r for r in doc["rows"] if r["load"]["label"] == label] + [overall]:
            t = row["targets"]
            means = "".join(_f(t[x]["e2e_mean_s"], ".3f", W + 1) for x in names)
            out.append(
                f"{label:<8}{row['workload']:<12}{t[names[0]]['n']:>4} {means} "
                f"{_f(row['oracle_e2e_mean_s'], '.3f', 7)}  "
                f"{ratio(row, 'dynamic_regret')}{ratio(row, 'regret')}"
                f"{ratio(row, 'gateway_vs_dynamic').rstrip()}"
            )
    whole = doc.get("gateway_vs_dynamic")
    if whole is not None:
        ci = Interval.of(doc.get("gateway_vs_dynamic_ci"))
        # a ratio of e2e times: above 1.0 the gateway is the slower one
        said = {"faster": "the gateway is slower", "slower": "the gateway is faster"}.get(
            conclusion(ci), "inconclusive, the interval holds 1.0"
        )
        out.append(
            f"gateway/dynamic over the whole run: {with_interval(whole, ci, speedup=False)} "
            f"(< 1: the gateway is faster; here: {said})"
        )
    return out
