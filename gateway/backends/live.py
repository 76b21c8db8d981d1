"""The load a decision sees when requests this process did not send are on the servers.

Each replica of the gateway (several `specroute serve` behind one front, or
other clients of the same vLLM servers) counts only its own requests in
flight; the rest show only in the servers' scraped running + waiting
(BackendState.others: that count less the gateway's own when the scrape came
in). The cost model reads both (BackendState.load). Two rules of the decision
read the gateway's own figures alone: a shared GPU is busy when the gateway has
a request on it, and a busy shared GPU's batch is held by the server that the
gateway's newest request went to. For one gateway with the servers to itself
both are right. For two replicas they are not: a replica with nothing in flight
saw an idle GPU under the other's batch, and each held the carrier its own
newest request went to, so two replicas kept the batch split across the two
servers (benchmarks/replicas.py, docs/scaling.md: both servers busy most of
the time at c=8 with two replicas, never with one).

So where the servers carry requests the gateway did not send, the decision gets
the whole server: its in-flight count is the server's load (own + others, and
others 0, so the load the cost model reads is unchanged), and no newest-request
order, which no replica knows for the others' requests: the holder is then the
server with the larger load, and every replica reads that from the same
servers' /metrics.

The shadow copies (gateway/shadow) are the other correction: a scrape that caught
one running counts it as another client's request, which it is not (it ends when
a user needs the GPU), so it is taken back out first (`pair_state`).

"Carry" means on two scrapes in a row. One scrape can show the gateway's own
requests after they ended (vLLM's gauge and the scrape's trip lag the stream's
last chunk), and a lone gateway that took that for another client's batch
treated an idle pair as busy: it kept short idle-gap requests on one server and
skipped their shadow copies (tests/gateway/test_shadow_emulated.py and the
page's shadow pairs failed that way, 2026-12-03). A lagging count is gone a
scrape (1 s) later; another replica's batch under load is not. Without such
requests (one replica, no other clients) the state is the gateway's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Protocol

from classifier.types import BackendState, LiveState, Route
from gateway.backends.pool import BackendPool


class Ghosts(Protocol):
    """What knows the requests a scrape counted that are no client's (the shadow runner)."""

    def caught(self, pair: int) -> Mapping[Route, int]:
        """Per route of `pair`: those its last scrape counted as running there."""
        ...


def for_decision(pool: BackendPool, ghosts: Ghosts) -> tuple[int, LiveState]:
    """What a new request is decided on: its GPU pair, chosen first, and that pair's
    live state as the policy reads it (less the ghosts a scrape caught, then the whole
    servers where others' requests are on them). The one place it is built, so that
    a request, the Envoy picker and /decide's dry run agree."""
    pair = pool.choose_pair()
    return pair, whole_servers(pair_state(pool, pair, ghosts), pool.others_before(pair))


def pair_state(pool: BackendPool, pair: int, ghosts: Ghosts) -> LiveState:
    """`pair`'s state without the shadows a scrape caught running (see above)."""
    state = pool.live_state(pair)
    caught = ghosts.caught(pair)
    if not any(caught.values()):
        return state
    return LiveState({r: _without(s, caught.get(r, 0)) for r, s in state.servers.items()})


def foreign(state: LiveState, others_before: Mapping[Route, int]) -> bool:
    """Requests the gateway did not send on one route of the pair, at the last scrape
    and at the one before it."""
    return any(
        (s.others or 0) > 0 and others_before.get(route, 0) > 0
        for route, s in state.servers.items()
    )


def whole_servers(state: LiveState, others_before: Mapping[Route, int]) -> LiveState:
    """`state` as the servers carry it, where others' requests are on them (see above)."""
    if not foreign(state, others_before):
        return state
    return LiveState({route: _whole(s) for route, s in state.servers.items()})


def _whole(backend: BackendState) -> BackendState:
    return dataclasses.replace(backend, inflight=backend.load, others=0, last_start=0)


def _without(state: BackendState, ghosts: int) -> BackendState:
    if not ghosts:
        return state
    return dataclasses.replace(
        state,
        others=None if state.others is None else max(0, state.others - ghosts),
        running=None if state.running is None else max(0, state.running - ghosts),
    )
