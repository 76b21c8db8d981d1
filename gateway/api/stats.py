"""GET /stats: the gateway's live figures as JSON, for the side-by-side page's panel.

Read from the gateway's own state, so no Grafana is needed: the request
counters and histograms of its Prometheus registry (what it answered, where,
how fast, with what acceptance), the policy's beliefs and the backends' live
state. Per workload: the route mix, the mean e2e per route, the acceptance
measured on the speculative route (per request, with its sources) next to the
acceptance the policy believes, both as vLLM counts it (accepted / drafted).

A speedup needs the same request on both routes. The gateway sends each request
to one; its shadow copies (gateway/shadow/runner.py) send some again to the other route
in idle time, and each comparable pair gives the live speedup (baseline e2e /
speculative e2e) and the regret of the choice, per workload and overall. Until
the first pair they are null, and "why" says why. The mean e2e per route is NOT
a speedup (different requests, different loads) and is labelled so.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from aiohttp import web
from prometheus_client.metrics import MetricWrapperBase

from classifier.features import Workload
from classifier.speculation import acceptance_rate
from classifier.types import Policy, Route
from gateway.shadow.results import PairTotals
from gateway.state import BACKENDS, CONFIG, METRICS, PROFILE_PROGRESS, RUNTIME, SHADOWS
from gateway.telemetry import Metrics

NO_PAIRS = "no comparable shadow pair yet (a copy runs in idle GPU time only)"
SHADOWS_OFF = "no paired measurement: shadow copies are off ([shadow] enabled = false)"
PAIRED = (
    "baseline e2e / speculative e2e over {n} shadow pairs (the same request on both "
    "routes, the copy in idle GPU time)"
)


async def stats(request: web.Request) -> web.Response:
    app = request.app
    snapshot = app[RUNTIME].current
    metrics, pool = app[METRICS], app[BACKENDS]
    k = snapshot.config.backends.speculative.num_speculative_tokens
    requests = _samples(metrics.requests, "_total")  # (route, workload, status)
    believed = snapshot.policy.estimated_acceptance()
    state = pool.live_state()
    pairs = app[SHADOWS].totals
    return web.json_response(
        {
            "object": "specroute.stats",
            "policy": snapshot.config.routing.policy,
            "num_speculative_tokens": k,
            "backends": {
                b.route.value: {
                    **dataclasses.asdict(state.of(b.route)),
                    "reachable": b.reachable,
                    "window_acceptance_rate": _gauge(metrics.backend_acceptance, b.route.value),
                }
                for b in pool
            },
            "requests": _total_by(requests, 0),  # per route, "none" for refused ones
            "reasons": _total_by(_samples(metrics.decisions, "_total"), 1),
            "workloads": {
                w.value: _workload(w, metrics, requests, believed.get(w), k, pairs)
                for w in Workload
            },
            "speedup": _overall(pairs, enabled=app[CONFIG].shadow.enabled),
            "profile": _profile(snapshot.policy, app[PROFILE_PROGRESS].stage),
        }
    )


def _profile(policy: Policy, measuring: str | None) -> dict[str, Any] | None:
    """The engine profile and its drift, and the stage of a profile being measured
    (None for a policy that wants none)."""
    if not policy.wants_profile:
        return None
    profile = policy.profile
    return {
        "in_use": profile is not None,
        "measuring": measuring,
        "drift": {r.value: round(v, 4) for r, v in policy.drift().items()},
        "contradicted": policy.profile_contradicted(),
        **({"profile": profile.to_json()} if profile is not None else {}),
    }


def _overall(pairs: PairTotals, *, enabled: bool) -> dict[str, Any]:
    value, n = pairs.overall()
    if value is None:
        return {"value": None, "pairs": 0, "why": NO_PAIRS if enabled else SHADOWS_OFF}
    return {"value": round(value, 4), "pairs": n, "why": PAIRED.format(n=n)}


def _workload(
    w: Workload,
    metrics: Metrics,
    requests: dict[tuple[str, ...], float],
    believed: float | None,
    k: int,
    pairs: PairTotals,
) -> dict[str, Any]:
    durations = _samples(metrics.duration, "_sum")  # (route, workload), 2xx only
    answered = _samples(metrics.duration, "_count")
    accepted = _samples(metrics.acceptance, "_sum")  # (workload, source)
    measured = _samples(metrics.acceptance, "_count")
    n = _sum(measured, (w.value,))
    return {
        "requests": {r.value: int(_sum(requests, (r.value, w.value))) for r in Route},
        "e2e_mean_s": {
            r.value: _mean(durations.get((r.value, w.value)), answered.get((r.value, w.value)))
            for r in Route
        },
        "acceptance": {
            "measured_rate": _mean(_sum(accepted, (w.value,)), n),
            "measured_requests": int(n),
            "sources": sorted(s for (wl, s), c in measured.items() if wl == w.value and c),
            "believed_rate": None if believed is None else round(acceptance_rate(believed, k), 4),
        },
        "speedup": _rounded(pairs.speedup(w.value)),
        "shadow_pairs": pairs.pairs.get(w.value, 0),
        "regret": _rounded(pairs.regret(w.value)),
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _samples(metric: MetricWrapperBase, suffix: str) -> dict[tuple[str, ...], float]:
    """One sample kind of a labelled metric (`_total`, `_sum`, `_count`), by label values."""
    out: dict[tuple[str, ...], float] = {}
    for family in metric.collect():
        for sample in family.samples:
            if sample.name == family.name + suffix:
                out[tuple(sample.labels.values())] = sample.value
    return out


def _total_by(samples: dict[tuple[str, ...], float], label: int) -> dict[str, int]:
    """The totals per value of one label, over all the others."""
    out: dict[str, float] = defaultdict(float)
    for labels, n in samples.items():
        out[labels[label]] += n
    return {value: int(n) for value, n in sorted(out.items())}


def _sum(samples: dict[tuple[str, ...], float], prefix: tuple[str, ...]) -> float:
    """The sum over the label sets that start with `prefix`."""
    return sum(v for labels, v in samples.items() if labels[: len(prefix)] == prefix)


def _mean(total: float | None, count: float | None) -> float | None:
    return round(total / count, 6) if total is not None and count else None


def _gauge(metric: MetricWrapperBase, backend: str) -> float | None:
    value = _samples(metric, "").get((backend,))
    return None if value is None or value != value else round(value, 4)  # NaN: unknown
