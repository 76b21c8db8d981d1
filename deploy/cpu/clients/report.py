"""One table from the result files of vLLM's bench client, guidellm and aiperf.

Reads OUT_DIR/<tool>/<target>/ as deploy/cpu/external_clients.sh leaves it:

- vllm:     result.json, `vllm bench serve --save-result` (completed, failed,
            mean_/p50_ e2el, ttft and tpot in ms);
- guidellm: benchmarks.json, `guidellm run --output kind=json` (the single
            benchmark's metrics: request_totals, request_latency in s,
            time_to_first_token_ms, inter_token_latency_ms);
- aiperf:   profile_export_aiperf.json, `aiperf profile` (request_count,
            error_request_count, request_latency, time_to_first_token,
            inter_token_latency, each in ms with avg and p50).

Every figure is the tool's own; nothing is re-measured. TPOT is each tool's
time per output token after the first: (e2e - TTFT) / (output tokens - 1) per
request, averaged over requests. vLLM calls it TPOT; guidellm and aiperf call
it inter-token latency (guidellm's own "TPOT", time_per_output_token_ms,
includes the first token, so it is not the one shown).

Prints the table to stdout and writes OUT_DIR/summary.json. Exits 1, with one
line on stderr, when a result file is missing or unreadable, or when a run has
failed requests or fewer successful ones than --expect.
Stdlib only: runs with any Python >= 3.11.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TOOLS = ("vllm", "guidellm", "aiperf")
RESULT_FILES = {
    "vllm": "result.json",
    "guidellm": "benchmarks.json",
    "aiperf": "profile_export_aiperf.json",
}
TPOT_SOURCE = {
    "vllm": "mean_tpot_ms / p50_tpot_ms",
    "guidellm": "inter_token_latency_ms (successful)",
    "aiperf": "inter_token_latency",
}


class ReportError(Exception):
    """One line saying which result file is wrong and how."""


@dataclass(frozen=True, slots=True)
class Row:
    tool: str
    target: str
    ok: int
    failed: int
    e2e_mean_ms: float
    e2e_p50_ms: float
    ttft_mean_ms: float
    ttft_p50_ms: float
    tpot_mean_ms: float
    tpot_p50_ms: float


def _num(obj: Any, *keys: str) -> float:
    """obj[k1][k2]... as a float; ReportError naming the path if absent."""
    cur = obj
    for key in keys:
        if not isinstance(cur, dict) or key not in cur:
            raise ReportError(f"no {'.'.join(keys)}")
        cur = cur[key]
    if isinstance(cur, bool) or not isinstance(cur, int | float):
        raise ReportError(f"{'.'.join(keys)} is not a number: {cur!r}")
    return float(cur)


def parse_vllm(data: Any, target: str) -> Row:
    return Row(
        "vllm",
        target,
        int(_num(data, "completed")),
        int(_num(data, "failed")),
        _num(data, "mean_e2el_ms"),
        _num(data, "p50_e2el_ms"),
        _num(data, "mean_ttft_ms"),
        _num(data, "p50_ttft_ms"),
        _num(data, "mean_tpot_ms"),
        _num(data, "p50_tpot_ms"),
    )


def parse_guidellm(data: Any, target: str) -> Row:
    benchmarks = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(benchmarks, list) or len(benchmarks) != 1:
        raise ReportError("expected exactly one benchmark in benchmarks")
    m = benchmarks[0].get("metrics")
    ok = _num(m, "request_totals", "successful")
    failed = _num(m, "request_totals", "errored") + _num(m, "request_totals", "incomplete")

    def stat(name: str, key: str, scale: float = 1.0) -> float:
        if key == "p50":
            return _num(m, name, "successful", "percentiles", "p50") * scale
        return _num(m, name, "successful", key) * scale

    return Row(
        "guidellm",
        target,
        int(ok),
        int(failed),
        stat("request_latency", "mean", 1000.0),
        stat("request_latency", "p50", 1000.0),
        stat("time_to_first_token_ms", "mean"),
        stat("time_to_first_token_ms", "p50"),
        stat("inter_token_latency_ms", "mean"),
        stat("inter_token_latency_ms", "p50"),
    )


def parse_aiperf(data: Any, target: str) -> Row:
    errors = data.get("error_request_count") if isinstance(data, dict) else None
    failed = int(_num(data, "error_request_count", "avg")) if errors else 0
    return Row(
        "aiperf",
        target,
        int(_num(data, "request_count", "avg")),
        failed,
        _num(data, "request_latency", "avg"),
        _num(data, "request_latency", "p50"),
        _num(data, "time_to_first_token", "avg"),
        _num(data, "time_to_first_token", "p50"),
        _num(data, "inter_token_latency", "avg"),
        _num(data, "inter_token_latency", "p50"),
    )


PARSERS = {"vllm": parse_vllm, "guidellm": parse_guidellm, "aiperf": parse_aiperf}


def read_row(out_dir: Path, tool: str, target: str) -> Row:
    path = out_dir / tool / target / RESULT_FILES[tool]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return PARSERS[tool](data, target)
    except OSError as exc:
        raise ReportError(f"{tool} against {target}: cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ReportError(f"{tool} against {target}: {path} is not JSON: {exc}") from None
    except ReportError as exc:
        raise ReportError(f"{tool} against {target}: {path}: {exc}") from None


def table(rows: list[Row]) -> str:
    head = (
        "tool",
        "target",
        "ok",
        "failed",
        "e2e mean",
        "e2e p50",
        "TTFT mean",
        "TTFT p50",
        "TPOT mean",
        "TPOT p50",
    )
    body = [
        (
            r.tool,
            r.target,
            str(r.ok),
            str(r.failed),
            *(
                f"{v:.1f}"
                for v in (
                    r.e2e_mean_ms,
                    r.e2e_p50_ms,
                    r.ttft_mean_ms,
                    r.ttft_p50_ms,
                    r.tpot_mean_ms,
                    r.tpot_p50_ms,
                )
            ),
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]

    def fmt(cells: tuple[str, ...]) -> str:
        return " | ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    lines = [fmt(head), "-+-".join("-" * w for w in widths), *(fmt(b) for b in body)]
    lines.append("ms; ok/failed: requests. TPOT: time per output token after the first, from")
    for tool in dict.fromkeys(r.tool for r in rows):
        lines.append(f"  {tool}: {TPOT_SOURCE[tool]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--tools", required=True, help="comma-separated, in table order")
    parser.add_argument("--targets", required=True, help="comma-separated names, in table order")
    parser.add_argument("--expect", type=int, default=0, help="successful requests per run")
    args = parser.parse_args(argv)
    tools = [t for t in args.tools.split(",") if t]
    targets = [t for t in args.targets.split(",") if t]
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        parser.error(f"unknown tool(s): {', '.join(unknown)}")
    try:
        rows = [read_row(args.out_dir, tool, target) for tool in tools for target in targets]
    except ReportError as exc:
        print(f"[clients] ERROR: {exc}", file=sys.stderr)
        return 1
    print(table(rows))
    summary = {"rows": [asdict(r) for r in rows], "tpot_source": TPOT_SOURCE}
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    bad = [r for r in rows if r.failed or (args.expect and r.ok < args.expect)]
    if bad:
        what = ", ".join(f"{r.tool} against {r.target} ({r.ok} ok, {r.failed} failed)" for r in bad)
        print(f"[clients] ERROR: requests failed or missing: {what}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
