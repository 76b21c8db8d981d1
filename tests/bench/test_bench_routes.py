"""`specroute bench` over N routes: every static route, the gateways and the oracle.

The figures first, on hand-made results (the oracle and the best pair by
construction), then one short EMULATED run through the real CLI: three routes on
one emulated GPU, the N-route gateway and one two-route gateway, at a tenth of
the modelled time.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.config import ConfigError
from tooling.bench.cli import add_arguments, options
from tooling.bench.routes import n_route, route_of
from tooling.loadgen import Result

ROOT = Path(__file__).resolve().parents[2]


def _result(index: int, e2e: float, route: str | None = None) -> Result:
    return Result("chat", True, 200, e2e, e2e / 4, 10, 20, route, None, index=index)


def _by_target(times: dict[str, list[float]], picks: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        t: {(0, i): _result(i, e) for i, e in enumerate(es)} for t, es in times.items()
    }
    out["gateway"] = {
        (0, i): _result(i, times[f"route:{p}"][i] * 1.01, p) for i, p in enumerate(picks)
    }
    return out


def test_the_oracle_is_the_fastest_route_per_request_and_the_gateway_is_judged_by_it() -> None:
    times = {
        "route:none": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        "route:a-k3": [0.5, 0.5, 2.0, 2.0, 1.5, 1.5],
        "route:b-k7": [0.8, 0.8, 0.6, 0.6, 1.5, 1.5],
    }
    fastest = ["a-k3", "a-k3", "b-k7", "b-k7", "none", "none"]
    got = n_route(_by_target(times, fastest), {})
    assert got is not None and got["n"] == 6
    assert got["oracle_e2e_mean_s"] == pytest.approx((0.5 * 2 + 0.6 * 2 + 1.0 * 2) / 6)
    assert got["oracle_picks"] == {"route:none": 2, "route:a-k3": 2, "route:b-k7": 2}
    assert got["best_static"] == "route:b-k7"  # mean 0.967 against 1.0 and 1.333
    # every pair misses something the third route has; b-k7 + none misses the least
    assert sorted(got["best_pair"]) == ["route:b-k7", "route:none"]
    # The gateway picked the fastest route every time, 1% slower: regret 1.01, and it
    # gets more than all the N-route oracle's gain over the pair's.
    assert got["regret"]["gateway"] == pytest.approx(1.01, abs=1e-4)
    assert got["oracle_agreement"]["gateway"] == 1.0
    assert got["capture"]["gateway"] > 0.9
    assert got["speedup_vs_best"]["gateway"] > 1.0
    assert set(got["speedup_vs_best"]) == {"route:none", "route:a-k3", "gateway"}


def test_the_oracle_is_never_slower_than_a_static_route() -> None:
    rng = random.Random(7)
    for _ in range(50):
        routes = [f"route:r{i}" for i in range(rng.randint(2, 5))]
        times = {t: [rng.uniform(0.1, 3.0) for _ in range(12)] for t in routes}
        picks = [route_of(rng.choice(routes)) or "" for _ in range(12)]
        got = n_route(_by_target(times, picks), {})
        assert got is not None
        for t in routes:
            assert got["oracle_e2e_mean_s"] <= got["e2e_mean_s"][t] + 1e-6
        assert got["oracle_e2e_mean_s"] <= got["pair_oracle_e2e_mean_s"] + 1e-6
        assert got["regret"]["gateway"] >= 1.0 - 1e-6  # no gateway beats the oracle here


def test_one_route_is_no_comparison() -> None:
    assert n_route({"route:none": {}, "gateway": {}}, {}) is None


@pytest.fixture(scope="module")
def routes_bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, str]:
    out = tmp_path_factory.mktemp("routes") / "bench.json"
    args = ["bench", "--emulate", "--routes", "none,eagle3:3,ngram:4", "--pair-with", "eagle3-k3"]
    args += ["--emulator-time-scale", "0.1", "--workload", "structured,creative"]
    args += ["--concurrency", "1", "--requests", "5", "--json", str(out)]
    args += ["--plot", str(out.with_suffix(".png"))]
    res = subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")  # speedups vs best
    return json.loads(out.read_text()), res.stdout, res.stderr


STATIC = ["route:none", "route:eagle3-k3", "route:ngram-k4"]
GATEWAYS = ["gateway", "gateway-2:eagle3-k3"]


def test_an_emulated_n_route_bench_has_every_route_both_gateways_and_the_oracle(
    routes_bench: tuple[dict[str, Any], str, str],
) -> None:
    doc, text, err = routes_bench
    assert doc["emulated"] is True and doc["complete"] is True
    assert list(doc["targets"]) == STATIC + GATEWAYS
    assert "EMULATED" in err and "on ONE emulated GPU" in err
    assert "route eagle3-k3 is EMULATED: measured GPU h200-llama3.1-8b" in err
    for row in doc["rows"] + doc["overall"]:
        got = row["n_route"]
        assert got["routes"] == STATIC and got["gateways"] == GATEWAYS
        assert got["n"] == (5 if row["workload"] != "all" else 10)
        for t in STATIC:
            assert got["oracle_e2e_mean_s"] <= got["e2e_mean_s"][t]
        assert set(got["regret"]) == set(GATEWAYS)
        assert set(got["speedup_vs_best"]) == {*STATIC, *GATEWAYS} - {got["best_static"]}
        # acceptance per speculative route, from its own server's counters
        assert got["acceptance"]["route:none"]["counters"] is None
        assert 0 < got["acceptance"]["route:eagle3-k3"]["counters"] <= 1
        assert got["acceptance"]["route:eagle3-k3"]["counters"] == pytest.approx(
            got["acceptance"]["route:eagle3-k3"]["per_request"], abs=0.02
        )
    # the N-route gateway answers on any of the three routes, the pair's on its two
    assert set(doc["overall"][0]["targets"]["gateway-2:eagle3-k3"]["routes"]) <= {
        "none",
        "eagle3-k3",
    }
    # The table: every static route, both gateways and the oracles, per load.
    assert text.startswith("specroute bench: EMULATED backends")
    lines = text.splitlines()
    for name in [*STATIC, *GATEWAYS, "oracle (all routes)", "oracle (best 2 routes)"]:
        assert any(line.startswith(f"{name} ") for line in lines), name
    assert "gateway/oracle regret over the whole run: " in text
    assert "gateway-2:eagle3-k3/oracle regret over the whole run: " in text


def test_the_two_route_invocation_still_reads_as_before() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--target", "baseline=http://h:1", "--target", "speculative=http://h:2"]
    argv += ["--target", "gateway=http://h:3"]
    assert list(options(parser.parse_args(argv), argv).targets) == [
        "baseline",
        "speculative",
        "gateway",
    ]


def test_bench_refuses_bad_route_flags() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for argv, message in [
        (["--routes", "none,eagle3:3"], "needs --emulate"),
        (["--emulate", "--routes", "none,eagle3"], "want none or DRAFTER:K"),
        (["--emulate", "--routes", "none,medusa:3"], "want none or DRAFTER:K"),
        (["--emulate", "--routes", "eagle3:3,ngram:4"], "want none and one route or more"),
        (["--emulate", "--routes", "none,eagle3:3,eagle3:3"], "each once"),
        (["--emulate", "--pair-with", "eagle3-k3"], "needs --routes"),
        (
            ["--emulate", "--routes", "none,eagle3:3", "--pair-with", "eagle3-k4"],
            "want a speculative route",
        ),
        (["--emulate", "--routes", "none,eagle3:3", "--pair-with", "none+none"], "or A"),
        (["--emulate", "--routes", "none,eagle3:3", "--with-dynamic"], "give one of them"),
    ]:
        with pytest.raises(ConfigError, match=message):
            options(parser.parse_args(argv), argv)
