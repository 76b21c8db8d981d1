"""`specroute advise INPUT`: should this traffic be speculated? Per workload, with reasons.

INPUT is a `specroute bench --json` document or the gateway's outcome log
(JSONL, rotated files may be given together). It prints per workload and
overall: share of traffic, measured acceptance, speedup at the observed
concurrency, the prefill share of each request's time, and a plain verdict;
then the talk's checklist answered from the data, and what the speculative
server's memory costs: draft weights and KV, read from the backends'
vllm:cache_config_info where they expose it (a bench records it; --spec-url /
--base-url read it live), else from --draft-gb / --draft-kv-gb, and it says
which. The analysis itself is tooling/bench/advice.py.

Beside an outcome log the gateway writes its shadow copies' lines
(outcomes.jsonl -> outcomes.shadows.jsonl; `"kind": "shadow"`: the same request
on the route not chosen, in idle GPU time; timings only): advise reads that
file too, given or found beside the log, and adds the live side-by-side they
measured, per workload: the paired speedup and the regret of the choices.

Every speedup and regret is printed with its 95% bootstrap interval, and a
workload whose speedup interval holds 1.0 (or that has too few requests for one)
gets INCONCLUSIVE, not a verdict (tooling/bench/advice.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from classifier.types import Route
from gateway.commands import Help
from gateway.shadow.results import SIDES, PairedTiming, PairSums, shadow_log_path
from tooling.bench.advice import Facts, from_bench, from_outcomes, speedup_text
from tooling.bench.intervals import Interval, conclusion, ratio_of_sums

GIB = 1024**3


HELP = Help(
    "from a bench JSON or an outcome log: speculate or not, per workload, and why",
    "Should this traffic be speculated? Per workload and overall: share of traffic, "
    "measured acceptance, speedup with its interval, the prefill share, a verdict (or "
    "INCONCLUSIVE), and what the draft costs in memory.",
    (
        "specroute advise bench.json",
        "specroute advise /var/lib/specroute/outcomes.jsonl* --k 4",
        "specroute advise bench.json --spec-url http://gpu:8001 --base-url http://gpu:8002",
    ),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", type=Path, nargs="+", help="bench JSON, or outcome log JSONL file(s)")
    p.add_argument(
        "--concurrency", type=int, help="bench input: judge at this load (default: the lowest)"
    )
    p.add_argument("--draft-gb", type=float, help="the draft model's weights, GiB")
    p.add_argument("--draft-kv-gb", type=float, help="the draft's KV cache, GiB")
    p.add_argument(
        "--spec-url", help="read the speculative server's cache config from its /metrics"
    )
    p.add_argument("--base-url", help="read the baseline server's cache config from its /metrics")
    p.add_argument("--k", type=int, default=4, help="outcome log: num_speculative_tokens")
    p.add_argument("--c", type=float, default=0.1, help="outcome log: draft cost ratio")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    return main(args)


def main(args: argparse.Namespace) -> int:
    try:
        kind, data = load(args.input)
        if kind == "bench":
            per, overall = from_bench(data, f"c={args.concurrency}" if args.concurrency else None)
            source = f"bench {args.input[0]}"
            emulated = bool(data.get("emulated"))
            targets = data.get("targets", {})
            caches = {
                n: (targets.get(n) or {}).get("cache_config") for n in ("speculative", "baseline")
            }
            kv_peak = max((r.get("spec_kv_peak") or 0.0 for r in data["overall"]), default=None)
            regret = (data.get("regret"), Interval.of(data.get("regret_ci")))
        else:
            per, overall = from_outcomes(data, args.k, args.c)
            source = f"outcome log {', '.join(map(str, args.input))} ({len(data)} records)"
            emulated, caches, kv_peak, regret = False, {}, None, (None, None)
    except (OSError, ValueError, KeyError) as exc:
        print(f"specroute advise: {exc}", file=sys.stderr)
        return 2
    live = (
        asyncio.run(_live(args.spec_url, args.base_url)) if args.spec_url or args.base_url else {}
    )
    caches = {**caches, **{k: v for k, v in live.items() if v}}
    print(render(source, emulated, per, overall, regret, kv_peak, caches, args))
    if kind == "outcomes":
        print("\n".join(["", *render_shadows(load_shadows(args.input))]))
    return 0


def load(paths: list[Path]) -> tuple[str, Any]:
    """("bench", document) or ("outcomes", records)."""
    first = paths[0].read_text()
    try:
        doc = json.loads(first)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and str(doc.get("schema", "")).startswith("specroute-bench/"):
        return "bench", doc
    records = []
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "route" in record:
                records.append(record)
    if not records:
        raise ValueError(f"{paths[0]}: neither a bench JSON nor an outcome log")
    return "outcomes", records


def load_shadows(paths: list[Path]) -> list[dict[str, Any]]:
    """The shadow copies' lines: in the files given, and in the shadow file beside each
    outcome log given (gateway/shadow/results.py names it)."""
    files = list(paths)
    for path in paths:
        beside = shadow_log_path(path)
        if beside not in files and beside.exists():
            files.append(beside)
    out = []
    for path in files:
        for line in path.read_text().splitlines():
            if '"kind":"shadow"' not in line.replace(" ", ""):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("kind") == "shadow":
                out.append(record)
    return out


def render_shadows(shadows: list[dict[str, Any]]) -> list[str]:
    """Per workload: copies that ran by outcome, comparable pairs, live speedup
    (baseline / speculative e2e) and regret (chosen / faster e2e), over those pairs."""
    head = "live side-by-side, from shadow copies (the same request on the route not chosen):"
    if not shadows:
        return [head, "  none in this log ([shadow] enabled = false, no idle time, or share 0)"]
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in shadows:
        by[str(record.get("workload"))].append(record)
    lines = [
        head,
        f"{'workload':<13}{'ran':>5}{'done':>6}{'cancel':>8}{'failed':>8}{'pairs':>7}  "
        f"{'speedup (95% interval)':<37}regret (95% interval)",
    ]
    for name, records in [*sorted(by.items()), ("all", shadows)]:
        outcomes = [r.get("outcome") for r in records]
        sums = PairSums()
        sides: dict[str, list[float]] = {side: [] for side in SIDES}
        for r in records:
            if r.get("comparable"):
                chosen, other = Route(r["primary_route"]), Route(r["shadow_route"])
                # Which speculates: the line says; a line from before routes had names,
                # the two-route configuration's "speculative".
                spec = r.get("speculated", Route.SPECULATIVE.value)
                timing = PairedTiming.of(
                    chosen, float(r["primary_s"]), other, float(r["shadow_s"]), {spec}
                )
                sums.add(timing)
                for side, seconds in timing.sides().items():
                    sides[side].append(seconds)
        speed_ci = ratio_of_sums(sides["baseline"], sides["speculative"])
        regret_ci = ratio_of_sums(sides["chosen"], sides["faster"])
        speedup = speedup_text(sums.speedup, speed_ci)
        if sums.speedup is not None:
            speedup += f" {conclusion(speed_ci)}"
        regret = "-"
        if sums.regret is not None:
            regret = f"{sums.regret:.3f}" + (
                f" [{regret_ci.lo:.3f}-{regret_ci.hi:.3f}]" if regret_ci else " [n<5]"
            )
        lines.append(
            f"{name:<13}{len(records):>5}{outcomes.count('completed'):>6}"
            f"{outcomes.count('cancelled'):>8}{outcomes.count('failed'):>8}{sums.pairs:>7}  "
            f"{speedup:<37}{regret}"
        )
    lines.append(
        "pairs: the user request ran alone on its GPU and the copy produced as many tokens; "
        "speedup = baseline / speculative e2e (higher is better), regret = the gateway's "
        "route / the faster (1.0 is the best); [lo-hi]: 95% bootstrap interval over the "
        "pairs, [n<5]: too few pairs for one"
    )
    return lines


async def _live(spec_url: str | None, base_url: str | None) -> dict[str, dict[str, str] | None]:
    import aiohttp

    from tooling.bench.targets import cache_config

    out: dict[str, dict[str, str] | None] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for name, url in (("speculative", spec_url), ("baseline", base_url)):
            if not url:
                continue
            try:
                async with session.get(f"{url.rstrip('/')}/metrics") as resp:
                    out[name] = cache_config(await resp.text())
            except (aiohttp.ClientError, TimeoutError):
                out[name] = None
    return out


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def render(
    source: str,
    emulated: bool,
    per: list[Facts],
    overall: Facts,
    regret: tuple[float | None, Interval | None],
    kv_peak: float | None,
    caches: dict[str, dict[str, str] | None],
    args: argparse.Namespace,
) -> str:
    mark = " (EMULATED backends: not real GPU figures)" if emulated else ""
    loads = [label for label, _ in overall.speedups]

    def speeds(f: Facts) -> str:
        cis = dict(f.intervals)
        return "  ".join(speedup_text(s, cis.get(x), f.has_intervals) for x, s in f.speedups)

    width = max(len(speeds(f)) for f in [*per, overall]) + 2
    head = f"speedup at {' / '.join(loads)} [95% interval]"
    width = max(width, len(head) + 2)
    lines = [
        f"specroute advise: {source}{mark}",
        f"speedup of the speculative server: {overall.speedup_source}, higher is better; "
        f"verdicts at {overall.at_label}; INCONCLUSIVE where the 95% interval holds 1.0",
        "",
        f"{'workload':<13}{'share':>6}{'accept':>8}  {head:<{width}}{'prefill':>8}  verdict",
    ]
    for f in [*per, overall]:
        accept = "-" if f.acceptance is None else f"{f.acceptance:.2f}"
        verdict = f.verdict if f is not overall else overall_verdict(per, overall, regret)
        lines.append(
            f"{f.workload:<13}{f.share:>6.0%}{accept:>8}  {speeds(f):<{width}}"
            f"{_pct(f.prefill_share):>8}  {verdict}"
        )
    lines += ["", "the checklist, from the data:", *checklist(per, overall, kv_peak)]
    lines += ["", "memory the speculative server costs:", *memory(caches, args, emulated)]
    return "\n".join(lines)


def overall_verdict(
    per: list[Facts], overall: Facts, regret: tuple[float | None, Interval | None]
) -> str:
    gaining = [f for f in per if f.speculate]
    unknown = [f for f in per if f.inconclusive]
    share = sum(f.share for f in gaining)

    def said(value: float | None, ci: Interval | None) -> str:
        text = speedup_text(value, ci, overall.has_intervals)
        unknown = value is not None and overall.has_intervals and conclusion(ci) == "inconclusive"
        return f"{text} inconclusive" if unknown else text

    tail = f"; speculating everything: {said(overall.speedup, overall.interval)}"
    if overall.gateway_speedup is not None:
        tail += f", the gateway: {said(overall.gateway_speedup, overall.gateway_interval)}"
    value, ci = regret
    if value is not None:
        interval = f" [{ci.lo:.3f}-{ci.hi:.3f}]" if ci else ""
        tail += f" (regret vs the per-request oracle {value:.3f}{interval})"
    if unknown:
        names = ", ".join(f.workload for f in unknown)
        tail += f"; INCONCLUSIVE for {names} ({sum(f.share for f in unknown):.0%} of traffic)"
    if gaining and len(gaining) == len(per):
        return f"SPECULATE everything: every workload gains{tail}"
    if not gaining and len(unknown) == len(per):
        return f"INCONCLUSIVE: no workload measured well enough to decide{tail}"
    if not gaining:
        return f"DON'T speculate: no workload gains enough{tail}"
    names = ", ".join(f.workload for f in gaining)
    return f"ROUTE PER REQUEST: {names} gain ({share:.0%} of traffic){tail}"


def checklist(per: list[Facts], overall: Facts, kv_peak: float | None) -> list[str]:
    structured = [f for f in per if f.structured]
    codeish = [f for f in per if f.workload in ("code", "sql")]
    prefill_bound = [f.workload for f in per if (f.prefill_share or 0.0) >= 0.5]
    gaining = [f for f in per if f.speculate]
    answer = f"{'yes' if structured else 'no'}: {sum(f.share for f in structured):.0%} of traffic"
    if codeish:
        answer += f"; code/SQL {sum(f.share for f in codeish):.0%}"
    at = overall.at_label
    held = []
    for f in gaining:
        last = [(label, s) for label, s in f.speedups if s is not None][-1]
        if last[0] != at:
            held.append(f"{f.workload} {last[1]:.2f}x at {last[0]}")
    batches = f"judged at {at}" + (f"; at the highest load: {', '.join(held)}" if held else "")
    if overall.concurrency is not None and overall.concurrency > 16:
        batches = f"NO, {batches}"
    spare = (
        "unknown: no KV-cache usage measured"
        if kv_peak is None
        else f"{'yes' if kv_peak < 0.8 else 'NO'}: the speculative server's KV cache peaked at "
        f"{kv_peak:.0%}"
    )
    short = (
        f"no for {', '.join(prefill_bound)} (prefill is half the time or more)"
        if prefill_bound
        else "yes: prefill is under half of every workload's time"
    )
    return [
        f"  structured output?  {answer}",
        f"  small batches?      {batches}",
        f"  short context?      {short}",
        f"  spare memory?       {spare}",
    ]


def memory(
    caches: dict[str, dict[str, str] | None], args: argparse.Namespace, emulated: bool
) -> list[str]:
    out = []
    if args.draft_gb is not None:
        out.append(f"  draft weights   {args.draft_gb:g} GiB (from --draft-gb)")
    else:
        out.append(
            "  draft weights   unknown: vLLM does not report its draft model; pass --draft-gb"
        )
    if args.draft_kv_gb is not None:
        out.append(f"  draft KV cache  {args.draft_kv_gb:g} GiB (from --draft-kv-gb)")
    for name in ("speculative", "baseline"):
        cache = caches.get(name)
        if cache:
            size = cache.get("kv_cache_memory_bytes")
            gib = f"{int(size) / GIB:.1f} GiB" if size and size.isdigit() else "? GiB"
            out.append(
                f"  {name} KV cache {gib} = {cache.get('kv_cache_size_tokens', '?')} tokens at "
                f"gpu_memory_utilization {cache.get('gpu_memory_utilization', '?')} "
                "(from vllm:cache_config_info)"
            )
    spec, base = caches.get("speculative"), caches.get("baseline")
    if spec and base and spec.get("kv_cache_size_tokens", "").isdigit():
        fewer = int(base.get("kv_cache_size_tokens", "0") or 0) - int(spec["kv_cache_size_tokens"])
        out.append(f"  -> the speculative server holds {fewer} fewer KV tokens than the baseline")
    if not spec and args.draft_kv_gb is None:
        why = "the emulator exposes none" if emulated else "no vllm:cache_config_info read"
        out.append(f"  KV cache        unknown: {why}; pass --spec-url or --draft-kv-gb")
    if args.draft_gb is not None or args.draft_kv_gb is not None:
        total = (args.draft_gb or 0.0) + (args.draft_kv_gb or 0.0)
        out.append(f"  total extra     {total:g} GiB (draft weights + draft KV, from the flags)")
    return out
