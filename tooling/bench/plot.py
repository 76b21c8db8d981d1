"""The bench as one picture: where speculation pays, why, and how load changes it.

Four panels, read left to right, top to bottom:
1. speedup over the baseline per workload (bars per target and load, each with
   its 95% bootstrap interval as an error bar, and `?` on its label when the
   interval holds 1.0: inconclusive; the dashed line at 1.0 is "no gain"): the answer;
2. draft acceptance per workload and load: the reason (and, with a "dynamic"
   target, the dynamic server's, from its own counters);
3. e2e latency vs load per target (mean, p95 dotted): where the answer flips;
4. time per output token vs load per target: decode speed, what speculation
   actually changes.
An EMULATED run says so in red across the top. matplotlib is an optional
dependency (the `bench` extra): without it, PlotUnavailable says how to get it.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from tooling.bench.intervals import Interval, conclusion
from tooling.bench.routes import is_n_route, route_of
from tooling.bench.stats import speedup_interval

COLORS = {
    "baseline": "#8c8c8c",
    "speculative": "#e07b39",
    "gateway": "#2a9d8f",
    "dynamic": "#1982c4",
}
# Other targets (N routes: route:NAME, gateway-2:...): distinct up to eight of them.
_EXTRA = ("#6a4c93", "#8ac926", "#c0392b", "#ffca3a", "#1b4332", "#ff595e", "#4361ee", "#b5838d")
_LOAD_ALPHA = (1.0, 0.55, 0.35, 0.22)


class PlotUnavailable(RuntimeError):
    """matplotlib is missing."""


def _color(name: str, names: list[str]) -> str:
    return COLORS.get(name) or _EXTRA[names.index(name) % len(_EXTRA)]


def pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg backend, or PlotUnavailable saying how to get it.
    The bench calls it before it starts anything: a missing matplotlib found after the
    whole run would cost the run."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable(
            f"--plot needs matplotlib: pip install './tooling[bench]' ({exc})"
        ) from None
    return plt


def plot(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    names = list(doc["targets"])
    loads = [r["load"] for r in doc["overall"]]
    workloads = list(dict.fromkeys(r["workload"] for r in doc["rows"]))
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5), dpi=110)
    _speedup(axes[0][0], doc, names, loads, workloads)
    _acceptance(axes[0][1], doc, names, loads, workloads)
    _vs_load(axes[1][0], doc, names, loads, "e2e_mean_s", "e2e_p95_s", "e2e latency (s)")
    _vs_load(axes[1][1], doc, names, loads, "tpot_p50_s", None, "time per output token (ms)")
    title = f"specroute bench: workload {Path(doc['workload']).name}"
    if doc.get("gateway_vs_dynamic") is not None:  # shorter, to fit a third figure
        if doc.get("regret") is not None:
            title += f"   |   gateway / oracle: {_ratio(doc, 'regret')}"
        title += f"   |   gateway / dynamic: {_ratio(doc, 'gateway_vs_dynamic')}"
    elif doc.get("regret") is not None:
        title += f"   |   gateway regret vs per-request oracle: {_ratio(doc, 'regret')}"
    fig.suptitle(title, fontsize=13, fontweight="bold", y=0.985)
    model = next((t["model"] for t in doc["targets"].values() if t.get("model")), "?")
    if doc["emulated"]:
        fig.text(
            0.5,
            0.945,
            "EMULATED backends: modelled GPU timing, no model runs. Not real measurements.",
            ha="center",
            color="#c0392b",
            fontsize=11,
            fontweight="bold",
        )
    fig.text(0.01, 0.008, f"model {model}; started {doc['started']}", fontsize=8, color="#666")
    fig.tight_layout(rect=(0, 0.02, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _ratio(doc: dict[str, Any], key: str) -> str:
    """`1.043 [1.007-1.090]`: a whole-run ratio with its 95% interval, where there is one."""
    ci = Interval.of(doc.get(f"{key}_ci"))
    return f"{doc[key]:.3f}" + (f" [{ci.lo:.3f}-{ci.hi:.3f}]" if ci else "")


def _rows(doc: dict[str, Any], label: str) -> dict[str, dict[str, Any]]:
    return {r["workload"]: r for r in doc["rows"] if r["load"]["label"] == label}


def _bars(
    ax: Any,
    groups: list[str],
    series: list[tuple[str, str, float, list[float | None]]],
    intervals: list[list[Interval | None]] | None = None,
) -> None:
    """Grouped bars: series = (label, color, alpha, one value per group), labelled on top;
    with `intervals` (one list per series), each bar's as an error bar, and `?` after the
    label of one whose interval holds 1.0 (or that has none)."""
    width = 0.8 / max(1, len(series))
    crowded = len(series) > 2
    for i, (label, color, alpha, values) in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ys = [v if v is not None else 0.0 for v in values]
        bars = ax.bar(xs, ys, width * 0.92, label=label, color=color, alpha=alpha)
        cis = intervals[i] if intervals is not None else [None] * len(values)
        for bar, v, ci in zip(bars, values, cis, strict=True):
            top = bar.get_height()
            mark = ""
            if intervals is not None and v is not None:
                mark = "?" if conclusion(ci) == "inconclusive" else ""
                if ci is not None:
                    x = bar.get_x() + bar.get_width() / 2
                    err = [[max(0.0, v - ci.lo)], [max(0.0, ci.hi - v)]]
                    ax.errorbar([x], [v], yerr=err, fmt="none", ecolor="#222", lw=1, capsize=3)
                    top = max(top, ci.hi)
            if v is not None and len(series) <= 8:
                ax.annotate(
                    f"{v:.2f}{mark}",
                    (bar.get_x() + bar.get_width() / 2, top),
                    ha="center",
                    va="bottom",
                    fontsize=6.5 if crowded else 8,
                    rotation=90 if crowded else 0,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
    ax.set_xticks(range(len(groups)), groups, rotation=0, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def _speedup(
    ax: Any, doc: dict[str, Any], names: list[str], loads: list[Any], wl: list[str]
) -> None:
    series = []
    intervals: list[list[Interval | None]] = []
    n_route = is_n_route(names)  # against each row's best static route (routes.py)
    for name in (n for n in names if n != "baseline" or n_route):
        for j, load in enumerate(loads):
            rows = _rows(doc, load["label"])
            if n_route:
                got = [rows.get(w, {}).get("n_route") or {} for w in wl]
                values = [g.get("speedup_vs_best", {}).get(name) for g in got]
                cis = [Interval.of(g.get("speedup_vs_best_ci", {}).get(name)) for g in got]
            else:
                values = [rows.get(w, {}).get("speedup", {}).get(name) for w in wl]
                cis = [speedup_interval(rows.get(w, {}), name) for w in wl]
            series.append(
                (f"{name} {load['label']}", _color(name, names), _LOAD_ALPHA[j % 4], values)
            )
            intervals.append(cis)
    _bars(ax, wl, series, intervals)
    highs = [ci.hi for cis in intervals for ci in cis if ci is not None]
    top = max([v for *_, vs in series for v in vs if v is not None] + highs + [1.2]) * 1.35
    ax.set_ylim(0, top)
    ax.axhspan(0, 1.0, color="#c0392b", alpha=0.06, zorder=0)
    ax.axhspan(1.0, top, color="#2a9d8f", alpha=0.06, zorder=0)
    ax.axhline(1.0, color="#333", linestyle="--", linewidth=1)
    title = "speedup over baseline (paired mean e2e, 95% interval; ? = inconclusive)"
    if n_route:
        title = "speedup over the best static route (paired, 95% interval; ? = inconclusive)"
    ax.set_title(title, fontsize=11)
    ax.set_ylabel("x best static route" if n_route else "x baseline")
    ax.legend(fontsize=8, ncol=2, loc="upper right")


def _acceptance(
    ax: Any, doc: dict[str, Any], names: list[str], loads: list[Any], wl: list[str]
) -> None:
    series = []
    if is_n_route(names):  # each speculative route's own counters (routes.py)
        for name in (n for n in names if route_of(n) is not None):
            for j, load in enumerate(loads):
                rows = _rows(doc, load["label"])
                accs = [
                    ((rows.get(w, {}).get("n_route") or {}).get("acceptance") or {}).get(name) or {}
                    for w in wl
                ]
                values = [a.get("counters") or a.get("per_request") for a in accs]
                if any(v is not None for v in values):
                    color = _color(name, names)
                    series.append((f"{name} {load['label']}", color, _LOAD_ALPHA[j % 4], values))
        _bars(ax, wl, series)
        ax.set_ylim(0, 1.05)
        ax.set_title("draft acceptance per route (accepted / proposed tokens)", fontsize=11)
        ax.set_ylabel("acceptance")
        ax.legend(fontsize=8, loc="upper right")
        return
    servers = [("speculative", "")] + ([("dynamic", "dynamic_")] if "dynamic" in names else [])
    for name, prefix in servers:
        for j, load in enumerate(loads):
            rows = _rows(doc, load["label"])
            values = []
            for w in wl:
                acc = rows.get(w, {}).get("acceptance", {})
                counters, per_request = (
                    acc.get(f"{prefix}counters"),
                    acc.get(f"{prefix}per_request"),
                )
                values.append(counters if counters is not None else per_request)
            label = load["label"] if len(servers) == 1 else f"{name} {load['label']}"
            series.append((label, COLORS[name], _LOAD_ALPHA[j % 4], values))
    _bars(ax, wl, series)
    ax.set_ylim(0, 1.05)
    ax.set_title("draft acceptance (accepted / proposed tokens)", fontsize=11)
    ax.set_ylabel("acceptance")
    ax.legend(fontsize=8, loc="upper right")


def _vs_load(
    ax: Any,
    doc: dict[str, Any],
    names: list[str],
    loads: list[Any],
    p50: str,
    p95: str | None,
    ylabel: str,
) -> None:
    scale = 1000.0 if "ms" in ylabel else 1.0
    xs = [load["value"] for load in loads]
    kind = loads[0]["kind"] if loads else "concurrency"
    for name in names:
        stats = [r["targets"].get(name, {}) for r in doc["overall"]]
        ys = [s.get(p50) * scale if s.get(p50) is not None else None for s in stats]
        what = "mean" if "mean" in p50 else "p50"
        ax.plot(xs, ys, marker="o", color=_color(name, names), label=f"{name} {what}", lw=2)
        if p95 is not None:
            ys95 = [s.get(p95) * scale if s.get(p95) is not None else None for s in stats]
            ax.plot(xs, ys95, linestyle=":", marker=".", color=_color(name, names), alpha=0.7)
    if p95 is not None:
        ax.plot([], [], linestyle=":", marker=".", color="#555", label="p95 (dotted)")
    if kind != "replay" and len(xs) > 1 and max(xs) / min(xs) >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [load["label"] for load in loads], fontsize=9)
    ax.set_xlabel(
        {"concurrency": "requests in flight", "rate": "arrival rate (req/s)"}.get(kind, "replay")
    )
    values = [y for line in ax.get_lines() for y in line.get_ydata() if y is not None and y > 0]
    if values and max(values) / min(values) > 8:  # a long tail would flatten the means
        ax.set_yscale("log")
        ylabel += ", log scale"
    else:
        ax.set_ylim(bottom=0)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{ylabel.split(' (')[0]} vs load, all workloads", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
