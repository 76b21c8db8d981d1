"""POST /decide/v1/chat/completions and /decide/v1/completions: what the gateway would do.

The body of a request in, nothing forwarded: out come the features the router
reads from it, the route and reason the policy gives it now, both predicted
latencies (cost model only) and the acceptance the policy believes for its
workload. The side-by-side page (/ui) shows it above the two streams. It is
the policy's answer: an `x-specroute-route` header on the dry run is not read.

A dry run must leave the router as it was, and it does so with no copy:
decide() changes nothing in any policy, and its one random step (the cost
model's acceptance drawn from its posterior, to explore) is taken only with a
random generator, which a dry run does not pass. So the answer is the
posterior mean's: what a request on this load would get now, unless its own
draw explores. Nothing is logged but the error middleware's line for a
refusal; the prompt never is.
"""

from __future__ import annotations

import dataclasses
import math

from aiohttp import web

from classifier.features import Endpoint, RequestFeatures
from classifier.speculation import acceptance_rate, alpha_from_rate
from classifier.types import Decision, LiveState, Policy, Route
from gateway.request.pipeline import live_state, read_and_analyse
from gateway.state import RUNTIME


async def chat_completions(request: web.Request) -> web.Response:
    return await _decide(request, Endpoint.CHAT)


async def completions(request: web.Request) -> web.Response:
    return await _decide(request, Endpoint.COMPLETIONS)


async def _decide(request: web.Request, endpoint: Endpoint) -> web.Response:
    app = request.app
    snapshot = app[RUNTIME].current
    config = snapshot.config
    _, _, features = await read_and_analyse(request, endpoint, config)
    pair, state = live_state(app)  # as a request would be: the pair first, then the route
    decision = preview(snapshot.policy, features, state, pair)
    k = config.backends.speculative.num_speculative_tokens
    return web.json_response(
        {
            "object": "specroute.decision",
            "forwarded": False,
            "policy": config.routing.policy,
            "pair": pair,
            "route": decision.route.value,
            "reason": decision.reason,
            "predicted_s": _predicted(decision),
            "predicted_speedup": _speedup(decision),
            "why": dict(decision.why) if decision.why else None,
            "acceptance": _believed(features, snapshot.policy, decision, k),
            "features": dataclasses.asdict(features),
            "backends": {route.value: dataclasses.asdict(state.of(route)) for route in Route},
        }
    )


def preview(policy: Policy, features: RequestFeatures, state: LiveState, pair: int = 0) -> Decision:
    """policy.decide(features, state, pair) as a request would get it, without a draw
    (the posterior mean's answer). decide() is pure for every policy: nothing to copy."""
    return policy.decide(features, state, pair)


def _believed(
    features: RequestFeatures, policy: Policy, decision: Decision, k: int
) -> dict[str, object]:
    """The acceptance this decision used, as vLLM counts it (accepted / drafted tokens,
    what the page measures) and per position (a); None where the policy holds none."""
    used = (decision.why or {}).get("acceptance")
    if isinstance(used, int | float):
        rate: float | None = float(used)
    else:
        a = policy.estimated_acceptance().get(features.workload)
        rate = None if a is None else acceptance_rate(a, k)
    return {
        "workload": features.workload.value,
        "rate": None if rate is None else round(rate, 4),
        "per_position": None if rate is None else round(alpha_from_rate(rate, k), 4),
        "num_speculative_tokens": k,
    }


def _predicted(decision: Decision) -> dict[str, float] | None:
    if not decision.predicted_s:
        return None
    return {route.value: round(s, 6) for route, s in decision.predicted_s.items()}


def _speedup(decision: Decision) -> float | None:
    """Predicted baseline latency / speculative latency: above 1, speculative is faster."""
    predicted = decision.predicted_s or {}
    spec, base = predicted.get(Route.SPECULATIVE), predicted.get(Route.BASELINE)
    if spec is None or base is None or not (spec > 0 and math.isfinite(base)):
        return None
    return round(base / spec, 4)
