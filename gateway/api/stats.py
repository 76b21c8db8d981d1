"""GET /stats: the gateway's live figures as JSON, for the side-by-side page's panel.

Read from the gateway's own state, so no Grafana is needed: the request
counters and histograms of its Prometheus registry (what it answered, where,
how fast, with what acceptance), the policy's beliefs and the backends' live
state. Every per-route figure is keyed by the configured route's name, in the
configuration's order (`routes`, a list, gives that order and each route's
speculation). Per workload: the route mix, the mean e2e per route, and per
speculative route the acceptance measured there (per request, with its sources)
next to the acceptance the policy believes for it, both as vLLM counts it
(accepted / drafted).

A speedup needs the same request on two routes. The gateway sends each request
to one; its shadow copies (gateway/shadow/runner.py) send some again to another
route in idle time, and each comparable pair gives the regret of the choice and,
where one of the two routes speculates and the other does not, the live speedup
(the plain route's e2e / the speculative one's), per workload and overall
(gateway/shadow/results.py). Until the first pair they are null, and "why" says
why. The mean e2e per route is NOT a speedup (different requests, different
loads) and is labelled so.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from prometheus_client.metrics import MetricWrapperBase

from classifier.features import Workload
from classifier.speculation import acceptance_rate
from classifier.types import Policy, Route
from gateway.config import Config, RouteConfig
from gateway.shadow.results import PairTotals
from gateway.state import BACKENDS, CONFIG, METRICS, PROFILE_PROGRESS, RUNTIME, SHADOWS
from gateway.telemetry import Metrics

NO_PAIRS = "no comparable shadow pair yet (a copy runs in idle GPU time only)"
SHADOWS_OFF = "no paired measurement: shadow copies are off ([shadow] enabled = false)"
PAIRED = (
    "e2e without speculation / e2e with it, from {n} shadow pairs (the same request on "
    "two routes, the copy in idle GPU time; a pair of two speculative routes counts in "
    "the regret only)"
)


Samples = list[tuple[dict[str, str], float]]  # (labels by name, value) per sample


def route_list(config: Config) -> list[dict[str, Any]]:
    """The configured routes in order, each with its speculation (what the page builds
    its columns from): a list, since a JSON object's key order is not every reader's."""
    return [
        {"name": r.value, "method": c.method, "num_speculative_tokens": c.num_speculative_tokens}
        for r, c in config.routes.items()
    ]


async def stats(request: web.Request) -> web.Response:
    app = request.app
    snapshot = app[RUNTIME].current
    routes = snapshot.config.routes
    metrics, pool = app[METRICS], app[BACKENDS]
    requests = _samples(metrics.requests, "_total")  # route, workload, status
    believed = snapshot.policy.estimated_acceptance()
    state = pool.live_state()
    pairs = app[SHADOWS].totals
    return web.json_response(
        {
            "object": "specroute.stats",
            "policy": snapshot.config.routing.policy,
            "routes": route_list(snapshot.config),
            "backends": {
                r.value: {
                    **dataclasses.asdict(state.of(r)),
                    "reachable": pool.of(r).reachable,
                    "window_acceptance_rate": _gauge(metrics.backend_acceptance, r.value),
                }
                for r in routes
            },
            "requests": _per_route(requests, routes),  # "_none": refused ones
            "reasons": _total_by(_samples(metrics.decisions, "_total"), "reason"),
            "workloads": {
                w.value: _workload(w, metrics, requests, believed, routes, pairs) for w in Workload
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
    requests: Samples,
    believed: Mapping[Route, Mapping[Workload, float]],
    routes: Mapping[Route, RouteConfig],
    pairs: PairTotals,
) -> dict[str, Any]:
    durations = _samples(metrics.duration, "_sum")  # route, workload; 2xx only
    answered = _samples(metrics.duration, "_count")
    return {
        "requests": {r.value: int(_sum(requests, route=r, workload=w)) for r in routes},
        "e2e_mean_s": {
            r.value: _mean(
                _sum(durations, route=r, workload=w), _sum(answered, route=r, workload=w)
            )
            for r in routes
        },
        "acceptance": {
            r.value: _acceptance(w, r, c, metrics, believed.get(r, {}).get(w), routes)
            for r, c in routes.items()
            if c.speculative
        },
        "speedup": _rounded(pairs.speedup(w.value)),
        "shadow_pairs": pairs.pairs.get(w.value, 0),
        "regret": _rounded(pairs.regret(w.value)),
    }


def _acceptance(
    w: Workload,
    route: Route,
    config: RouteConfig,
    metrics: Metrics,
    believed: float | None,
    routes: Mapping[Route, RouteConfig],
) -> dict[str, Any]:
    """One speculative route's acceptance on one workload: measured there (the
    per-request histogram) and believed (the policy's a, as a rate with this route's k)."""
    k = config.num_speculative_tokens
    accepted = _samples(metrics.acceptance, "_sum")  # [route,] workload, source
    measured = _samples(metrics.acceptance, "_count")
    here = _measured_where(measured, route, routes)
    rate = None if believed is None else round(acceptance_rate(believed, k), 4)
    if here is None:  # several speculative routes and a histogram without their name
        return {
            "num_speculative_tokens": k,
            "measured_rate": None,
            "measured_requests": None,
            "sources": [],
            "believed_rate": rate,
        }
    n = _sum(measured, workload=w, **here)
    return {
        "num_speculative_tokens": k,
        "measured_rate": _mean(_sum(accepted, workload=w, **here), n),
        "measured_requests": int(n),
        "sources": sorted(
            {labels["source"] for labels, c in measured if c and _has(labels, workload=w, **here)}
        ),
        "believed_rate": rate,
    }


def _measured_where(
    samples: Samples, route: Route, routes: Mapping[Route, RouteConfig]
) -> dict[str, str] | None:
    """The labels that pick one route's measurements: its name when the histogram has a
    route label; without one, all of them are the one speculative route's, and with
    several they cannot be told apart (None: unknown, never read as none measured)."""
    if any("route" in labels for labels, _ in samples):
        return {"route": route.value}
    alone = sum(c.speculative for c in routes.values()) == 1
    return {} if alone or not samples else None  # no samples: none measured anywhere


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _samples(metric: MetricWrapperBase, suffix: str) -> Samples:
    """One sample kind of a labelled metric (`_total`, `_sum`, `_count`), with its labels."""
    return [
        (dict(sample.labels), sample.value)
        for family in metric.collect()
        for sample in family.samples
        if sample.name == family.name + suffix
    ]


def _per_route(samples: Samples, routes: Mapping[Route, RouteConfig]) -> dict[str, int]:
    """Totals per configured route in order (0 for one with none), then any other value
    of the route label after them ("_none": requests refused before a route)."""
    totals = _total_by(samples, "route")
    return {r.value: totals.pop(r.value, 0) for r in routes} | totals


def _total_by(samples: Samples, label: str) -> dict[str, int]:
    """The totals per value of one label, over all the others."""
    out: dict[str, float] = defaultdict(float)
    for labels, n in samples:
        out[labels[label]] += n
    return {value: int(n) for value, n in sorted(out.items())}


def _has(labels: Mapping[str, str], **match: str) -> bool:
    return all(labels.get(name) == value for name, value in match.items())


def _sum(samples: Samples, **match: str) -> float:
    """The sum over the samples whose labels have these values."""
    return sum(v for labels, v in samples if _has(labels, **match))


def _mean(total: float, count: float) -> float | None:
    return round(total / count, 6) if count else None


def _gauge(metric: MetricWrapperBase, route: str) -> float | None:
    value = next((v for labels, v in _samples(metric, "") if labels.get("route") == route), None)
    return None if value is None or value != value else round(value, 4)  # NaN: unknown
