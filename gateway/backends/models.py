"""Which models each route serves, from its servers' /v1/models, read with each health probe.

Two servers started with different `--served-model-name` values both answer /health,
so a route that does not have the requested model looked as good as one that has it:
the request went there and came back 404. Each endpoint's last good /v1/models is kept
on it (`Upstream.models`; None until one is read: unknown, never a reason to refuse).

A route serves a model when every endpoint of it whose models are known lists it: a
request for the model may go to any of them. For one request, a route known not to serve
its model is unavailable (`ModelFilter`): marked unhealthy in the decision's state, left
out of the failover order, and never chosen while a route that serves it is left. A model
no route serves goes on unchanged, and vLLM answers its own 404. Each endpoint that lacks
a model another route serves is logged once (a warning), again only after its models
change. /ready is 503 while the routes serve no model in common, naming what each lacks
(the config names no model), and says what each route lacks when ready too; /v1/models
lists every model with the routes that serve it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
import structlog

from classifier.types import LiveState, Route
from gateway.backends.scraper import read_limited

if TYPE_CHECKING:
    from gateway.backends.pool import Backend, BackendPool, Upstream

log = structlog.get_logger("specroute.backends")

# A models list is a few KB; a longer answer is a bad one, and is not read to its end.
MAX_MODELS_BYTES = 2**20


async def model_cards(
    session: aiohttp.ClientSession, base_url: str, headers: Mapping[str, str], timeout_s: float
) -> dict[str, dict[str, Any]] | None:
    """A server's model cards by id, or None for any bad answer: not 200, too long, not
    JSON, JSON too deep for the parser (a RecursionError, not a ValueError), no list."""
    try:
        async with session.get(
            f"{base_url}/v1/models",
            headers=dict(headers),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            body = await read_limited(resp, MAX_MODELS_BYTES) if resp.status == 200 else None
        payload = json.loads(body) if body is not None else None
    except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError):
        return None
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return None
    cards = (card for card in data if isinstance(card, dict) and isinstance(card.get("id"), str))
    return {card["id"]: card for card in cards}


def note_models(upstream: Upstream, cards: dict[str, dict[str, Any]] | None) -> bool:
    """Keep a probe's read of an endpoint's models (a failed read keeps the last good
    one); True when they changed."""
    if cards is None or (upstream.models is not None and cards.keys() == upstream.models.keys()):
        return False
    upstream.models = cards
    upstream.models_warned.clear()  # what it lacks is news again
    return True


def served(backend: Backend) -> frozenset[str] | None:
    """The models every endpoint of the route whose models are known lists (None: none known)."""
    return _common(u.models for u in backend.upstreams)


def routes_serving(
    answers: Iterable[tuple[Route, Collection[str] | None]],
) -> dict[str, list[Route]]:
    """Each model a route serves, and the routes that serve it, from each endpoint's
    models (None: unknown) by its route."""
    by_route: dict[Route, list[Collection[str] | None]] = {}
    for route, models in answers:
        by_route.setdefault(route, []).append(models)
    out: dict[str, list[Route]] = {}
    for route, endpoints in by_route.items():
        for model in sorted(_common(endpoints) or ()):
            out.setdefault(model, []).append(route)
    return out


def _common(endpoints: Iterable[Collection[str] | None]) -> frozenset[str] | None:
    known = [frozenset(models) for models in endpoints if models is not None]
    return frozenset.intersection(*known) if known else None


def _known(pool: BackendPool) -> dict[Route, frozenset[str]]:
    """The models each route serves, for the routes whose models are known."""
    return {b.route: models for b in pool if (models := served(b)) is not None}


def lacking(pool: BackendPool) -> dict[Route, frozenset[str] | None]:
    """Per route, the models another route serves and it does not (None: its models are
    unknown), for /ready to say which route lacks which model."""
    known = _known(pool)
    every = frozenset[str]().union(*known.values())
    return {b.route: every - known[b.route] if b.route in known else None for b in pool}


def readiness_problem(pool: BackendPool) -> str | None:
    """Why the routes cannot stand in for each other, or None: no model that every route
    with known models serves. Names what each route lacks."""
    known = _known(pool)
    if not known or frozenset.intersection(*known.values()):
        return None
    lacks = lacking(pool)
    return "no model is served by every route: " + "; ".join(
        f"route {route.value} serves {sorted(models)}, lacks {sorted(lacks[route] or ())}"
        for route, models in known.items()
    )


@dataclasses.dataclass(frozen=True, slots=True)
class ModelFilter:
    """One request's model, and the routes known not to serve it."""

    model: str | None
    lacking: frozenset[Route] = frozenset()

    @classmethod
    def of(cls, pool: BackendPool, body: Mapping[str, Any]) -> ModelFilter:
        """The request's filter. A model no route serves filters nothing: the request goes
        on unchanged and vLLM answers its own 404, the body a client of vLLM expects (the
        real tier's SDK test compares them field by field)."""
        model = body.get("model")
        if not isinstance(model, str):
            return cls(None)  # vLLM answers with its own model, or its own error
        lacking = frozenset(b.route for b in pool if _lacks(b, model))
        if lacking and len(lacking) == sum(1 for _ in pool):
            return cls(model)
        for backend in pool:  # a model some route serves: the others lacking it are news
            if backend.route in lacking:
                _warn(backend, model)
        return cls(model, lacking)

    def state(self, state: LiveState) -> LiveState:
        """The decision's state with the routes that lack the model unavailable."""
        if not self.lacking:
            return state
        return LiveState(
            {
                route: dataclasses.replace(s, healthy=False) if route in self.lacking else s
                for route, s in state.servers.items()
            }
        )

    def serving(self, routes: Iterable[Route]) -> tuple[Route, ...]:
        """`routes` less those that lack the model."""
        return tuple(r for r in routes if r not in self.lacking)


def _lacks(backend: Backend, model: str) -> bool:
    """Some endpoint of the route is known not to serve `model`."""
    return any(u.models is not None and model not in u.models for u in backend.upstreams)


def _warn(backend: Backend, model: str) -> None:
    """One line per endpoint and model, again only once its models change: a model no
    route serves is the client's mistake (its 404 is logged), and is never noted here,
    so what is noted stays as small as what the routes serve."""
    for upstream in backend.upstreams:
        if upstream.models is None or model in upstream.models:
            continue
        if model not in upstream.models_warned:
            upstream.models_warned.add(model)
            log.warning(
                "route_lacks_model",
                route=backend.route.value,
                model=model,
                served=sorted(upstream.models),
            )
