"""POST /decide/v1/chat/completions and /decide/v1/completions: what the gateway would do.

The body of a request in, nothing forwarded: out come the features the router
reads from it, the route and reason the policy gives it now, every route's
predicted latency (cost model only) and, per speculative route, the acceptance
the policy believes for its workload; every per-route figure keyed by the
configured route's name, in the configuration's order (`routes` lists them with
their speculation). The side-by-side page (/ui) shows it above the streams. It
is the policy's answer: an `x-specroute-route` header on the dry run is not read.

A dry run must leave the router as it was, and it does so with no copy:
decide() changes nothing in any policy, and its one random step (the cost
model's acceptance drawn from its posterior, to explore) is taken only with a
random generator, which a dry run does not pass. So the answer is the
posterior mean's: what a request on this load would get now, unless its own
draw explores. A route known not to serve the request's model is left out as
it is for the request (gateway/backends/models.py), so the dry run names the
route the request would take. Nothing is logged but the error middleware's line
for a refusal, and the models' one line per route that lacks one; the prompt
never is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from aiohttp import web

from classifier.features import Endpoint, RequestFeatures
from classifier.speculation import acceptance_rate, alpha_from_rate
from classifier.types import Decision, LiveState, Policy, Route
from gateway.api.stats import route_list
from gateway.backends.models import ModelFilter
from gateway.config import Config
from gateway.request.pipeline import live_state, read_and_analyse, steer_to_model
from gateway.request.targets import with_targets
from gateway.state import BACKENDS, RUNTIME


async def chat_completions(request: web.Request) -> web.Response:
    return await _decide(request, Endpoint.CHAT)


async def completions(request: web.Request) -> web.Response:
    return await _decide(request, Endpoint.COMPLETIONS)


async def _decide(request: web.Request, endpoint: Endpoint) -> web.Response:
    app = request.app
    snapshot = app[RUNTIME].current
    config = snapshot.config
    _, body, features = await read_and_analyse(request, endpoint, config)
    features = with_targets(features, request.headers, body, config)
    served = ModelFilter.of(app[BACKENDS], body)  # routes without its model: unavailable
    pair, state = live_state(app, served)  # as a request would be: the pair, then the route
    decision = steer_to_model(preview(snapshot.policy, features, state), served, config.routes)
    over = reference(config)
    return web.json_response(
        {
            "object": "specroute.decision",
            "forwarded": False,
            "policy": config.routing.policy,
            "pair": pair,
            "routes": route_list(config),
            "route": decision.route.value,
            "reason": decision.reason,
            "predicted_s": _predicted(decision, config),
            "speedup_over": None if over is None else over.value,
            "predicted_speedup": _speedup(decision, config, over),
            "why": dict(decision.why) if decision.why else None,
            "acceptance": {
                route.value: _believed(
                    features, snapshot.policy, decision, route, c.num_speculative_tokens
                )
                for route, c in config.routes.items()
                if c.speculative
            },
            "features": dataclasses.asdict(features),
            "backends": {r.value: dataclasses.asdict(state.of(r)) for r in config.routes},
        }
    )


def preview(policy: Policy, features: RequestFeatures, state: LiveState) -> Decision:
    """policy.decide(features, state) as a request would get it, without a draw
    (the posterior mean's answer). decide() is pure for every policy: nothing to copy."""
    return policy.decide(features, state)


def reference(config: Config) -> Route | None:
    """The route speedups are over: the first configured without speculation (the
    two-route config's "baseline"); None when every route speculates."""
    return next((r for r, c in config.routes.items() if not c.speculative), None)


def _believed(
    features: RequestFeatures, policy: Policy, decision: Decision, route: Route, k: int
) -> dict[str, object]:
    """The acceptance this decision used on `route` (a speculative one, of k drafts),
    as vLLM counts it (accepted / drafted tokens, what the page measures) and per
    position (a); None where the policy holds none."""
    used = (decision.why or {}).get("acceptance")
    if isinstance(used, Mapping) and isinstance(used.get(route.value), int | float):
        rate: float | None = float(used[route.value])
    else:
        a = policy.estimated_acceptance().get(route, {}).get(features.workload)
        rate = None if a is None else acceptance_rate(a, k)
    return {
        "workload": features.workload.value,
        "rate": None if rate is None else round(rate, 4),
        "per_position": None if rate is None else round(alpha_from_rate(rate, k), 4),
        "num_speculative_tokens": k,
    }


def _predicted(decision: Decision, config: Config) -> dict[str, float] | None:
    """Seconds, send to last byte, per route in the configuration's order."""
    predicted = decision.predicted_s
    if not predicted:
        return None
    return {r.value: round(predicted[r], 6) for r in config.routes if r in predicted}


def _speedup(decision: Decision, config: Config, over: Route | None) -> dict[str, float] | None:
    """Per route, the reference route's predicted latency / its own: above 1, the route
    is predicted faster than the reference (1.0 for the reference itself). None without
    predictions or a reference; a route without a finite prediction is left out."""
    predicted = decision.predicted_s or {}
    base = predicted.get(over) if over is not None else None
    if base is None or not math.isfinite(base):
        return None
    return {
        r.value: round(base / s, 4)
        for r in config.routes
        if (s := predicted.get(r)) is not None and s > 0 and math.isfinite(s)
    }
