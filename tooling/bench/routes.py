"""N routes benched side by side: every static route, the gateways, and the oracles.

Targets named `route:NAME` are the servers of route NAME, each benched alone
(a static route); "baseline" and "speculative" are the two-route config's routes
under their old names. A target named "gateway" is the gateway over all routes;
any other target whose name starts with "gateway-" is another gateway (the bench's
own: "gateway-2:NAME", a two-route gateway over the plain route and route NAME).

Definitions, over the requests every route and every gateway answered (the same
request on each, so the means compare; `n` says how many):
- best static: the route with the lowest mean e2e on these requests.
- speedup_vs_best[T]: best static's mean e2e / T's (paired; > 1: T is faster).
- oracle: per request the fastest of the static routes' measured e2e (what a
  router that always knew the answer, at no cost, would get); never slower than
  any static route on these requests, by construction.
- pair oracle: the same over two routes only; best_pair: the pair whose oracle is
  the fastest (the best a two-route gateway could do).
- regret[G]: gateway G's mean e2e / the oracle's (1.0: the oracle's time).
- capture[G]: (pair oracle - G) / (pair oracle - oracle): the share of what the
  N-route oracle gains over the best two-route oracle that G gets (1: all of it;
  None when that gain is under MIN_GAIN of the pair's mean e2e); oracle_gain_over_pair:
  pair oracle / oracle - 1.
- acceptance[route]: accepted / proposed drafts per speculative route, from its
  server's counters over its own run ("counters") and from its per-request metrics.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping
from typing import Any

from tooling.bench.intervals import ratio_of_sums
from tooling.loadgen import Result

ROUTE_PREFIX = "route:"
GATEWAY = "gateway"
TWO_ROUTE_GATEWAY = "gateway-2:"  # + the speculative route it pairs with the plain one
LEGACY_ROUTES = ("baseline", "speculative")

Key = tuple[int, int]  # (cell number, request index)
# capture divides by the N-route oracle's gain over the best pair's: under 1% of the
# pair's mean e2e that gain is within a few requests' noise at the bench's sizes (a
# judgement, not a measurement), and the ratio would read as +-10x; it is None then.
MIN_GAIN = 0.01


def route_of(target: str) -> str | None:
    """The gateway's name for the route a static target serves (None: not a route)."""
    if target.startswith(ROUTE_PREFIX):
        return target[len(ROUTE_PREFIX) :]
    return target if target in LEGACY_ROUTES else None


def is_gateway(target: str) -> bool:
    return target == GATEWAY or target.startswith("gateway-")


def is_n_route(targets: list[str]) -> bool:
    """Whether a bench names its routes (`route:NAME`): then the N-route table reports it."""
    return any(t.startswith(ROUTE_PREFIX) for t in targets)


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _ci(num: list[float], den: list[float]) -> list[float] | None:
    ci = ratio_of_sums(num, den)
    return ci.to_json() if ci is not None else None


def n_route(
    by_target: Mapping[str, Mapping[Key, Result]],
    counters: Mapping[str, float | None],
) -> dict[str, Any] | None:
    """The N-route figures of one row (definitions above); None without two routes."""
    routes = [t for t in by_target if route_of(t) is not None]
    gateways = [t for t in by_target if is_gateway(t)]
    if len(routes) < 2:
        return None
    ok = {t: {k: r.e2e_s for k, r in by_target[t].items() if r.ok} for t in routes + gateways}
    keys = sorted(set.intersection(*(set(v) for v in ok.values())))
    out: dict[str, Any] = {
        "routes": routes,
        "gateways": gateways,
        "n": len(keys),
        "acceptance": {
            t: {
                "counters": counters.get(t),
                "per_request": _per_request(by_target[t].values()),
            }
            for t in routes
        },
    }
    if not keys:
        return out
    mean = {t: statistics.fmean(ok[t][k] for k in keys) for t in ok}
    oracle = {k: min(ok[t][k] for t in routes) for k in keys}
    oracle_mean = statistics.fmean(oracle.values())
    best = min(routes, key=lambda t: mean[t])
    pairs = {
        (a, b): statistics.fmean(min(ok[a][k], ok[b][k]) for k in keys)
        for a, b in itertools.combinations(routes, 2)
    }
    best_pair = min(pairs, key=lambda p: pairs[p])
    pair_mean = pairs[best_pair]
    fastest = [min(routes, key=lambda t: ok[t][k]) for k in keys]
    out |= {
        "e2e_mean_s": {t: _r(v, 6) for t, v in mean.items()},
        "best_static": best,
        "oracle_e2e_mean_s": _r(oracle_mean, 6),
        "oracle_picks": {t: fastest.count(t) for t in routes},
        "best_pair": list(best_pair),
        "pair_oracle_e2e_mean_s": _r(pair_mean, 6),
        "oracle_gain_over_pair": _r(pair_mean / oracle_mean - 1.0) if oracle_mean > 0 else None,
        "speedup_vs_best": {},
        "speedup_vs_best_ci": {},
        "regret": {},
        "regret_ci": {},
        "capture": {},
        "oracle_agreement": {},
    }
    base = [ok[best][k] for k in keys]
    for t in [*routes, *gateways]:
        if t != best:
            mine = [ok[t][k] for k in keys]
            out["speedup_vs_best"][t] = _r(sum(base) / sum(mine))
            out["speedup_vs_best_ci"][t] = _ci(base, mine)
    gain = pair_mean - oracle_mean
    for g in gateways:
        mine = [ok[g][k] for k in keys]
        out["regret"][g] = _r(sum(mine) / sum(oracle.values()))
        out["regret_ci"][g] = _ci(mine, list(oracle.values()))
        meaningful = gain > MIN_GAIN * pair_mean
        out["capture"][g] = _r((pair_mean - mean[g]) / gain, 3) if meaningful else None
        picked = [(by_target[g][k].route, f) for k, f in zip(keys, fastest, strict=True)]
        routed = [(p, f) for p, f in picked if p]
        out["oracle_agreement"][g] = (
            _r(sum(p == route_of(f) for p, f in routed) / len(routed), 3) if routed else None
        )
    return out


def _per_request(results: Any) -> float | None:
    drafted = accepted = 0
    for r in results:
        if r.ok and r.spec_drafted and r.spec_accepted is not None:
            drafted += r.spec_drafted
            accepted += r.spec_accepted
    return round(accepted / drafted, 4) if drafted else None


# ---- the table -------------------------------------------------------------------------


def table(doc: dict[str, Any]) -> str:
    """Per load: one line per target (every static route, every gateway) and the
    oracles; mean e2e per workload and over all, then the whole load's speedup
    against the best static route, regret against the N-route oracle, capture."""
    out: list[str] = []
    for overall in doc["overall"]:
        label = overall["load"]["label"]
        rows = [r for r in doc["rows"] if r["load"]["label"] == label] + [overall]
        whole = overall.get("n_route")
        if whole is None or "e2e_mean_s" not in whole:
            out += ["", f"== {label} == no request answered by every route and gateway"]
            continue
        workloads = [r["workload"] for r in rows]
        cols = "".join(f"{w[:10]:>11}" for w in workloads)
        out += [
            "",
            f"== {label} == mean e2e (s) on the requests every route and gateway answered "
            f"(n = {whole['n']} over all)",
            f"{'target':<26}{cols}  {'vs best static':<22}{'regret':<20}{'capture':>8}"
            f"  {'accept':>6}  routes",
        ]
        for t in [*whole["routes"], *whole["gateways"]]:
            means = "".join(
                _num((r.get("n_route") or {}).get("e2e_mean_s", {}).get(t)) for r in rows
            )
            speed = "best" if t == whole["best_static"] else _ratio(whole, "speedup_vs_best", t, 2)
            regret = _ratio(whole, "regret", t, 3) if t in whole["gateways"] else ""
            capture = whole["capture"].get(t) if t in whole["gateways"] else None
            acc = (whole["acceptance"].get(t) or {}).get("counters")
            if acc is None:
                acc = (whole["acceptance"].get(t) or {}).get("per_request")
            picks = overall["targets"].get(t, {}).get("routes") or {}
            mix = " ".join(f"{k}:{v}" for k, v in picks.items())
            out.append(
                f"{t:<26}{means}  {speed:<22}{regret:<20}"
                f"{'-' if capture is None else f'{capture:.2f}':>8}  "
                f"{'-' if acc is None else f'{acc:.2f}':>6}  {mix}"
            )
        oracle = "".join(_num((r.get("n_route") or {}).get("oracle_e2e_mean_s")) for r in rows)
        pair = "".join(_num((r.get("n_route") or {}).get("pair_oracle_e2e_mean_s")) for r in rows)
        picks = " ".join(f"{route_of(t)}:{n}" for t, n in whole["oracle_picks"].items())
        out.append(f"{'oracle (all routes)':<26}{oracle}  fastest per request: {picks}")
        best_pair = "+".join(str(route_of(t)) for t in whole["best_pair"])
        gain = whole["oracle_gain_over_pair"]
        out.append(
            f"{'oracle (best 2 routes)':<26}{pair}  on all: {best_pair}, the oracle over "
            f"all routes {'-' if gain is None else f'{gain * 100:.1f}%'} faster"
        )
    out += [
        "",
        "vs best static = best static route's mean e2e / target's, paired per request "
        "[95% bootstrap interval] (> 1: faster); regret = gateway / oracle over all routes "
        "(1.0 is the best); capture = (best two-route oracle - gateway) / (best two-route "
        "oracle - oracle over all routes): the share of the N-route oracle's gain the "
        "gateway gets (-: that gain under 1%); best 2 routes: the pair (any two) whose "
        "oracle is the fastest, per column; accept = accepted/proposed drafts (its "
        "server's counters)",
    ]
    return "\n".join(out)


def _num(value: float | None) -> str:
    return f"{'-':>11}" if value is None else f"{value:>11.3f}"


def _ratio(whole: dict[str, Any], key: str, target: str, digits: int) -> str:
    value = whole[key].get(target)
    if value is None:
        return "-"
    ci = whole[f"{key}_ci"].get(target)
    unit = "x" if key.startswith("speedup") else ""
    text = f"{value:.{digits}f}{unit}"
    return text + (f" [{ci[0]:.{digits}f}-{ci[1]:.{digits}f}]" if ci else " [no interval]")
