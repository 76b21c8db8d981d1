"""The filters: the routes a request may take, before any is priced.

The guards first (classifier/guards.py), each speculative route on its own, then
health. The routes that do not serve the request's model are left out before this,
in gateway/ (ModelFilter), and the policy sees the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from classifier.cost import route_of, routes_of
from classifier.guards import GuardsConfig
from classifier.profile import EngineProfile
from classifier.types import LiveState, Route


@dataclass(frozen=True, slots=True)
class Candidates:
    routes: tuple[Route, ...]  # every route, in the profile's order
    speculative: tuple[Route, ...]
    spared: dict[Route, str]  # each speculative route a guard took out: its reason
    allowed: list[Route]  # past the guards (every route where they took out all)
    choice: list[Route]  # the healthy allowed, else the healthy of all, else allowed

    @property
    def guarded(self) -> bool:
        """The guards left no speculative route to choose: their reason decides."""
        return bool(self.spared) and not any(r in self.choice for r in self.speculative)


def candidates(profile: EngineProfile, state: LiveState, guards: GuardsConfig) -> Candidates:
    routes = routes_of(profile)
    speculative = tuple(r for r in routes if route_of(profile, r).speculative)
    lightest = min((state.of(r).load for r in routes if r not in speculative), default=None)
    priced = profile.source != "prior"
    spared = {
        r: reason
        for r in speculative
        if (reason := guards.reason(state.of(r), batch_priced=priced, lightest_other=lightest))
        is not None
    }
    allowed = [r for r in routes if r not in spared] or list(routes)
    healthy = [r for r in allowed if state.of(r).healthy] or [
        r for r in routes if state.of(r).healthy
    ]
    return Candidates(routes, speculative, spared, allowed, healthy or allowed)
