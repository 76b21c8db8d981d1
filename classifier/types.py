"""The vocabulary every policy shares: routes, live state, a decision, the protocol.

A policy is a small object (RouteLLM's router shape): features and live state in, a
Decision out, no I/O and no clock. decide() reads and never writes, its only randomness
the caller's rng, and every decision says why in a low-cardinality reason (a metric
label); learn() and the other learning hooks write what the gateway measured.

The routes are configured by name (RouteSpec); the two-route configuration is a
speculative and a baseline route. A host with N GPUs runs N groups (a server of every
route on each GPU): the gateway picks the group and hands the policy its LiveState. One
profile and one set of beliefs serve all groups; each FinishedRequest names its group
(`pair`, 0 .. N-1).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from classifier.features import RequestFeatures, Workload
from classifier.speculation import Schedule, k_at

if TYPE_CHECKING:
    from classifier.profile import EngineProfile

__all__ = [
    "ROUTE_NAME",
    "TWO_ROUTES",
    "BackendState",
    "Decision",
    "FinishedRequest",
    "LiveState",
    "Policy",
    "Route",
    "RouteSpec",
    "two_routes",
]


class Route(str):
    """A route's configured name (`[routes.NAME]`): one server configuration of the model.

    A name, not a fixed pair: a deployment may run none, EAGLE k=3 and k=7 side by
    side. SPECULATIVE and BASELINE are the names of the two-route configuration
    (`[backends.speculative]`, `[backends.baseline]`), which stays valid. Compare
    routes with ==, never `is`: a name read from a header or a state file is
    another object with the same text.
    """

    __slots__ = ()

    SPECULATIVE: ClassVar[Route]
    BASELINE: ClassVar[Route]

    @property
    def value(self) -> str:
        """The name as text (labels, JSON, headers)."""
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"Route({str.__str__(self)!r})"


Route.SPECULATIVE = Route("speculative")
Route.BASELINE = Route("baseline")

# A route's name: what a metric label, a header and a TOML table key can all hold.
ROUTE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


@dataclass(frozen=True, slots=True)
class RouteSpec:
    """What a policy knows of a configured route before any profile: its speculation.

    method: vLLM's speculative method ("ngram", "eagle", "eagle3", "draft_model",
    "mtp", ...; "none" without speculation); k: its num_speculative_tokens (0: none);
    draft_cost_ratio: one draft token's cost over one target step, used only by the
    built-in prior before the profile measures the route; device: the device its server
    runs on as configured ("": not said, every route shares one); k_by_batch: a dynamic
    server's K per batch size (vLLM's num_speculative_tokens_per_batch_size, k its most;
    (): static k).
    """

    name: Route
    k: int = 0
    method: str = "none"
    draft_cost_ratio: float = 0.0
    device: str = ""
    k_by_batch: Schedule = ()

    def __post_init__(self) -> None:
        if not ROUTE_NAME.match(self.name):
            raise ValueError(f"route name {self.name!r}: want [a-z0-9][a-z0-9_-]*, at most 63")
        if self.k < 0 or (self.k == 0) != (self.method == "none"):
            raise ValueError(f"route {self.name}: k={self.k} with method {self.method!r}")
        if not 0.0 <= self.draft_cost_ratio <= 10.0:
            raise ValueError(f"route {self.name}: draft_cost_ratio out of [0, 10]")
        if self.k_by_batch and (self.k == 0 or max(e[2] for e in self.k_by_batch) > self.k):
            raise ValueError(f"route {self.name}: a K by batch size above k={self.k}")

    @property
    def speculative(self) -> bool:
        return self.k > 0

    def k_at(self, batch: float) -> int:
        """The drafts it proposes per step at this batch size."""
        return k_at(self.k_by_batch, batch, self.k)


def two_routes(
    k: int = 4, draft_cost_ratio: float = 0.1, method: str = "draft_model"
) -> tuple[RouteSpec, RouteSpec]:
    """The two-route configuration: a speculative server and one without speculation."""
    return RouteSpec(Route.SPECULATIVE, k, method, draft_cost_ratio), RouteSpec(Route.BASELINE)


# Its defaults: k=4 with a draft model's cost ratio of 0.1 (the config's defaults).
TWO_ROUTES = two_routes()
# Its names, in its order.
PAIR = (Route.SPECULATIVE, Route.BASELINE)


@dataclass(frozen=True, slots=True)
class BackendState:
    inflight: int = 0  # the gateway's own in-flight count for that backend
    healthy: bool = True
    running: int | None = None  # scraped vllm:num_requests_running (None = unknown)
    waiting: int | None = None  # scraped vllm:num_requests_waiting
    kv_cache_usage: float | None = None  # scraped vllm:kv_cache_usage_perc, 0..1
    # Prompt tokens of the gateway's streamed requests there that have no first
    # token yet: a new request's prefill queues behind them (chunked prefill
    # serves prompts in arrival order). Non-streamed requests are not counted
    # (their first token is not seen), so this is a lower bound.
    prefill_tokens: int = 0
    # Requests there that the gateway did not send (other clients), as of the last
    # scrape: the server's running + waiting then, less the gateway's in-flight
    # count then. None: not known that way (a bare snapshot).
    others: int | None = None
    # The gateway's requests in flight there, per workload (the carrier rule's mix).
    mix: tuple[tuple[Workload, int], ...] = ()
    # The gateway's newest request there, numbered across all backends (0: none):
    # the server a busy GPU's batch is heading to, while the other still drains.
    last_start: int = 0
    # The most sequences it decodes at once (the gateway's admission limit there, set to
    # vLLM's max_num_seqs as config.toml asks); None: unbounded as far as anyone said.
    capacity: float | None = None

    @property
    def load(self) -> int:
        """Requests in flight there: the gateway's own (exact, live) plus other clients'.

        Without `others`, the gateway's count or the server's running, the higher.
        The server's count alone is a scrape old: it said 2 running on a server the
        gateway had just seen finish both, and the cost model sent creative text
        to the speculative server because the baseline "had" a batch.
        """
        if self.others is not None:
            return self.inflight + self.others
        return max(self.inflight, self.running or 0)


@dataclass(frozen=True, slots=True)
class LiveState:
    """Every route's server, as the gateway sees it now, in the configuration's order."""

    servers: Mapping[Route, BackendState]

    @staticmethod
    def pair(speculative: BackendState, baseline: BackendState) -> LiveState:
        """The two-route configuration's state."""
        return LiveState({Route.SPECULATIVE: speculative, Route.BASELINE: baseline})

    def of(self, route: Route) -> BackendState:
        return self.servers[route]

    @property
    def routes(self) -> tuple[Route, ...]:
        return tuple(self.servers)


@dataclass(frozen=True, slots=True)
class Decision:
    route: Route
    reason: str
    predicted_s: Mapping[Route, float] | None = None  # filled by the cost model
    # Why, for the request's log line and /decide: the predictions' parts, the
    # acceptance used and the rule that decided (the profiled policy fills it).
    why: Mapping[str, object] | None = None


class FinishedRequest(Protocol):
    """One finished, successful request, as the gateway measured it: what a policy learns from."""

    @property
    def route(self) -> Route: ...  # the route that answered
    @property
    def features(self) -> RequestFeatures: ...
    @property
    def state(self) -> LiveState: ...  # the snapshot the decision was made from
    @property
    def ttft_s(self) -> float | None: ...  # streamed only
    @property
    def duration_s(self) -> float: ...
    @property
    def prompt_tokens(self) -> int | None: ...  # the backend's usage
    @property
    def completion_tokens(self) -> int: ...
    @property
    def acceptance(self) -> float | None: ...  # accepted drafts per step / k, speculative only
    @property
    def predicted_s(self) -> float | None: ...  # the prediction for the route that answered
    @property
    def pair(self) -> int: ...  # the pair its decision was made for (its `state`'s)


class Policy(Protocol):
    """What the gateway holds and calls, whatever the policy: one decision per request,
    and every way it learns. A policy with nothing to learn makes the learning calls
    no-ops, so no gateway module asks which policy it holds."""

    def decide(
        self, features: RequestFeatures, state: LiveState, rng: random.Random | None = None
    ) -> Decision:
        """The route, among those `state` describes; `rng`, the caller's, for a policy
        that explores by drawing (None: no draw). Reads only."""

    # ---- learning: the only writers --------------------------------------------------

    def learn(self, outcome: FinishedRequest) -> None:
        """One finished, successful answer."""

    def learn_failure(self, route: Route, features: RequestFeatures) -> None:
        """An answer `route` failed (an error status, a stream that broke)."""

    def learn_shadow(self, outcome: FinishedRequest) -> None:
        """A shadow copy's answer: a measurement at no user's expense."""

    def use_profile(self, profile: EngineProfile) -> None:
        """The servers' engine profile, measured or reloaded."""

    def load_state(self, raw: object) -> None:
        """What an earlier run learned (state_to_json's); ValueError when it does not
        apply, and then nothing is taken."""

    # ---- what it holds -----------------------------------------------------------------

    @property
    def wants_profile(self) -> bool:
        """Whether it decides on an engine profile: only then does the gateway measure one."""

    @property
    def profile(self) -> EngineProfile | None:
        """The engine profile in use (None: none yet, or none wanted)."""

    def profile_contradicted(self) -> bool:
        """Whether live traffic says the profile is wrong: profile again."""

    def drift(self) -> Mapping[Route, float]:
        """Live decode time over the profile's, per route (empty: no profile)."""

    def state_to_json(self) -> dict[str, Any] | None:
        """What it learned, to keep across a restart (None: nothing to keep)."""

    def estimated_acceptance(self) -> Mapping[Route, Mapping[Workload, float]]:
        """Per-position draft acceptance per speculative route and workload as believed
        now (empty: no estimate)."""

    def shared_gpu(self, pair: int = 0) -> bool | None:
        """Whether the policy routes as if the pair's two servers share one GPU (None: no
        such notion, or not measured yet)."""
