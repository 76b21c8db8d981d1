"""Bootstrap intervals on the bench's speedups and regrets, and what the table and
`advise` conclude from them: a clear win is called one, a win that rests on one
lucky request is INCONCLUSIVE, whatever its point figure.

The results are made here (no servers): the bench's own stats turn them into rows,
the table and advise read the rows as they read a bench's JSON.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from tooling.bench.intervals import (
    MIN_PAIRS,
    Interval,
    conclusion,
    describe,
    ratio_of_sums,
    resampled,
)
from tooling.bench.plan import Cell, Load
from tooling.bench.progress import Progress
from tooling.bench.report import SCHEMA, table
from tooling.bench.runner import CellRun, Run
from tooling.bench.stats import rows, whole_run
from tooling.loadgen import Result

LOAD = Load("concurrency", 1)


def _results(workload: str, e2e: list[float], route: str | None = None) -> list[Result]:
    return [
        Result(workload, True, 200, s, s / 10, 100, 50, route, None, index=i)
        for i, s in enumerate(e2e)
    ]


def _doc(cases: dict[str, tuple[list[float], list[float]]]) -> dict[str, Any]:
    """A bench document: per workload, the baseline's and the speculative server's e2e
    for the same requests; the gateway takes the faster of the two plus 2%."""
    cell_runs = []
    for workload, (base, spec) in cases.items():
        gw = [min(b, s) * 1.02 for b, s in zip(base, spec, strict=True)]
        routes = ["speculative" if s < b else "baseline" for b, s in zip(base, spec, strict=True)]
        cell_run = CellRun(Cell(LOAD, workload, [], None))
        cell_run.runs["baseline"] = Run(_results(workload, base), sum(base))
        cell_run.runs["speculative"] = Run(_results(workload, spec), sum(spec))
        cell_run.runs["gateway"] = Run(
            [
                Result(workload, True, 200, s, s / 10, 100, 50, r, None, index=i)
                for i, (s, r) in enumerate(zip(gw, routes, strict=True))
            ],
            sum(gw),
        )
        cell_runs.append(cell_run)
    per_workload, overall = rows(cell_runs)
    run = whole_run(cell_runs)
    return {
        "schema": SCHEMA,
        "emulated": False,
        "workload": ",".join(cases),
        "targets": {n: {"name": n} for n in ("baseline", "speculative", "gateway")},
        "rows": per_workload,
        "overall": overall,
        "regret": run["regret"],
        "regret_ci": run["regret_ci"],
        "intervals": describe(),
    }


# A clear win: 30 requests, every one about 1.6x faster speculated (a deterministic wobble).
CLEAR = (
    [1.0 + 0.05 * (i % 7) for i in range(30)],
    [0.62 + 0.04 * (i % 5) for i in range(30)],
)
# 1.49x from 6 requests, all of it from one: five are 10% SLOWER speculated, one long
# request is 4x faster. The point figure says 1.49x; the requests cannot say which way.
LUCKY = ([1.0, 1.0, 1.0, 1.0, 1.0, 5.0], [1.1, 1.1, 1.1, 1.1, 1.1, 1.2])


def test_a_clear_win_has_an_interval_above_one() -> None:
    ci = ratio_of_sums(*CLEAR)
    assert ci is not None
    point = sum(CLEAR[0]) / sum(CLEAR[1])
    assert 1.0 < ci.lo < point < ci.hi < 2.0
    assert conclusion(ci) == "faster"
    slower = ratio_of_sums(CLEAR[1], CLEAR[0])
    assert slower is not None and conclusion(slower) == "slower" and slower.hi < 1.0


def test_a_win_from_one_lucky_request_is_inconclusive() -> None:
    point = sum(LUCKY[0]) / sum(LUCKY[1])
    assert round(point, 2) == 1.49
    ci = ratio_of_sums(*LUCKY)
    assert ci is not None and ci.lo < 1.0 < ci.hi
    assert conclusion(ci) == "inconclusive"


def test_intervals_are_seeded_and_need_enough_requests() -> None:
    assert ratio_of_sums(*CLEAR) == ratio_of_sums(*CLEAR)  # the same data, the same interval
    assert ratio_of_sums(*LUCKY) == ratio_of_sums(list(LUCKY[0]), list(LUCKY[1]))
    few = ratio_of_sums(CLEAR[0][: MIN_PAIRS - 1], CLEAR[1][: MIN_PAIRS - 1])
    assert few is None and conclusion(few) == "inconclusive"
    with pytest.raises(ValueError, match="pair up"):
        ratio_of_sums([1.0, 2.0], [1.0])
    # independent samples (an outcome log's two routes): a median ratio
    ci = resampled([CLEAR[0], CLEAR[1]], lambda d: float(d[0].mean() / d[1].mean()), resamples=500)
    assert ci is not None and ci.lo > 1.0
    assert Interval.of(ci.to_json()) == ci and Interval.of(None) is None


def test_the_bench_rows_carry_every_interval_and_the_table_says_what_they_conclude() -> None:
    doc = _doc({"structured": CLEAR, "creative": LUCKY})
    json.dumps(doc, allow_nan=False)  # plain JSON: no NaN, no infinity
    by = {r["workload"]: r for r in doc["rows"]}
    structured, creative = by["structured"], by["creative"]
    for row in [*doc["rows"], *doc["overall"]]:
        assert set(row["speedup_ci"]) == {"speculative", "gateway"}
        assert row["regret_ci"] is not None
        lo, hi = row["regret_ci"]
        assert lo <= row["regret"] <= hi
    lo, hi = structured["speedup_ci"]["speculative"]
    assert 1.0 < lo <= structured["speedup"]["speculative"] <= hi
    lo, hi = creative["speedup_ci"]["speculative"]
    assert lo < 1.0 < hi and creative["speedup"]["speculative"] == pytest.approx(1.49, abs=0.01)

    text = table(doc)
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    assert lines["95%"].split()[:3] == ["95%", "intervals", "n"]
    assert re.search(r"1\.6\dx \[1\.\d\d-1\.\d\d\] faster", lines["structured"])
    assert re.search(r"1\.49x \[0\.\d\d-\d\.\d\d\] inconclusive", lines["creative"])
    # the main table: the mean beside the p50, and `?` on the inconclusive speedup
    header = next(line for line in text.splitlines() if "e2e p50 (s)" in line)
    assert header.index("e2e mean (s)") < header.index("e2e p50 (s)")
    main_rows = {line.split()[0]: line.split() for line in text.splitlines() if line[:1].isalpha()}
    assert "1.49x?" in main_rows["creative"] and "1.49x" not in main_rows["structured"]
    assert any(re.fullmatch(r"1\.6\dx", cell) for cell in main_rows["structured"])
    assert "gateway/oracle regret over the whole run: 1.0" in text
    assert re.search(r"whole run: \d\.\d{3} \[\d\.\d{3}-\d\.\d{3}\]", text)


def _advise(doc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    assert main(["advise", str(path)]) == 0
    return capsys.readouterr().out


def _verdicts(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.split():
            out.setdefault(line.split()[0], line)
    return out


def test_advise_calls_a_clear_win_with_its_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc({"structured": CLEAR, "creative": (CLEAR[1], CLEAR[0])})
    lines = _verdicts(_advise(doc, tmp_path, capsys))
    assert re.search(
        r"SPECULATE: structured output; 1\.6\dx \[1\.\d\d-1\.\d\d\] at c=1$", lines["structured"]
    )
    assert re.search(
        r"DON'T: slower \(measured\); 0\.6\dx \[0\.\d\d-0\.\d\d\] at c=1$", lines["creative"]
    )
    assert "ROUTE PER REQUEST: structured gain (50% of traffic)" in lines["overall"]
    assert "INCONCLUSIVE" not in lines["overall"]
    assert re.search(
        r"regret vs the per-request oracle 1\.0\d\d \[1\.\d{3}-1\.\d{3}\]", lines["overall"]
    )


def test_advise_never_speculates_on_six_lucky_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc({"structured": LUCKY, "creative": (CLEAR[1], CLEAR[0])})
    text = _advise(doc, tmp_path, capsys)
    lines = _verdicts(text)
    assert "SPECULATE" not in lines["structured"]
    assert re.search(
        r"INCONCLUSIVE: 1\.49x \[0\.\d\d-\d\.\d\d\] at c=1 from 6 requests: its 95% interval "
        r"holds 1\.0, so they cannot tell faster from slower; measure more$",
        lines["structured"],
    )
    assert "DON'T speculate: no workload gains enough" in lines["overall"]
    assert "INCONCLUSIVE for structured (17% of traffic)" in lines["overall"]
    assert "INCONCLUSIVE where the 95% interval holds 1.0" in text


def test_advise_says_dont_when_even_the_top_of_the_interval_would_not_pay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Level within noise (an interval across 1.0) but under 1.10x at both ends: the
    direction is unknown, the answer is not: no end of it pays for the draft."""
    level = ([1.0] * 30, [1.0 + 0.08 * (i % 5 - 2) for i in range(30)])
    ci = ratio_of_sums(*level)
    assert ci is not None and ci.lo < 1.0 < ci.hi < 1.10
    lines = _verdicts(_advise(_doc({"chat": level}), tmp_path, capsys))
    assert re.search(
        r"DON'T: gain too small to pay for the draft's memory \(measured\); 1\.00x "
        r"\[0\.\d\d-1\.0\d\] \(faster or slower: unknown; under 1\.10x either way\) at c=1$",
        lines["chat"],
    )


def test_advise_with_too_few_requests_for_an_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    few = (CLEAR[0][:4], CLEAR[1][:4])
    lines = _verdicts(_advise(_doc({"structured": few}), tmp_path, capsys))
    assert re.search(
        r"INCONCLUSIVE: 1\.\d\dx \[n<5\] at c=1 from 4 requests: too few "
        r"requests for an interval",
        lines["structured"],
    )
    assert "INCONCLUSIVE: no workload measured well enough to decide" in lines["overall"]


def test_advise_on_a_bench_json_from_before_intervals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc({"structured": LUCKY})
    del doc["intervals"], doc["regret_ci"]
    for row in [*doc["rows"], *doc["overall"]]:
        del row["speedup_ci"], row["regret_ci"]
    lines = _verdicts(_advise(doc, tmp_path, capsys))
    assert "SPECULATE" in lines["structured"]
    assert "1.49x (no interval: a bench JSON from before intervals) at c=1" in lines["structured"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _ran(progress: Progress, runs: int, each: int) -> None:
    ok = Result("x", True, 200, 0.1, 0.01, 3, 4, None, None)
    failed = Result("x", False, 500, 0.1, None, 3, None, None, None, error="boom")
    for i in range(runs):
        progress.start(f"c=1 x -> target{i}", each)
        for j in range(each):
            progress.tick(failed if (i, j) == (1, 0) else ok)
        progress.finish()
    progress.close()


def test_progress_in_a_log_gives_each_run_and_the_whole_benchs_rate_and_time_left() -> None:
    stream = io.StringIO()
    _ran(Progress(12, tag="bench", stream=stream), runs=3, each=4)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in stream.getvalue()
    assert re.fullmatch(
        r"\[bench\] c=1 x -> target0: 4/4 ok in \d+\.\d s; the bench: 4/12 req, "
        r"[\d.]+ ?\S*req/s, \d\d:\d\d left",
        lines[0],
    ), lines[0]
    assert lines[1].startswith("[bench] c=1 x -> target1: 3/4 ok, 1 FAILED in ")
    assert "the bench: 12/12 req" in lines[2] and lines[2].endswith("00:00 left")
    stream = io.StringIO()  # --duration: no total, so no time left; the count and the rate
    _ran(Progress(0, stream=stream), runs=1, each=3)
    assert re.search(r"the bench: 3 req, [\d.]+ ?\S*req/s$", stream.getvalue().strip())


def test_progress_on_a_terminal_is_a_bar_with_rate_and_time_left() -> None:
    stream = _Terminal()
    _ran(Progress(8, tag="bench", stream=stream), runs=2, each=4)
    text = stream.getvalue()
    assert "\r" in text  # redrawn in place
    bars = [part for part in text.split("\r") if "|" in part]
    assert re.search(
        r"\[bench\] c=1 x -> target1: 100%\|#+\| 8/8 \[\d\d:\d\d<\d\d:\d\d, ", bars[-1]
    )
    assert "req/s]" in bars[-1]
    assert "[bench] c=1 x -> target0: 4/4 ok in " in text  # each run's line stays


def test_the_table_without_enough_requests_says_so() -> None:
    doc = _doc({"structured": (CLEAR[0][:3], CLEAR[1][:3])})
    text = table(doc)
    line = next(ln for ln in text.splitlines() if ln.startswith("  structured"))
    assert "[no interval] inconclusive" in line
