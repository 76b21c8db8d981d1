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
servers (benchmarks/replicas.py, docs/scaling.md: at c=8 on one emulated GPU,
both servers busy 98% and 60% of the busy time in two runs with two replicas,
0-2% with one).

So where a scrape shows requests the gateway did not send, the decision gets
the whole server: its in-flight count is the server's load (own + others, and
others 0, so the load the cost model reads is unchanged), and no newest-request
order, which no replica knows for the others' requests: the holder is then the
server with the larger load, and every replica reads that from the same
servers' /metrics. Without such requests (one replica, no other clients) the
state is the gateway's own, unchanged.
"""

from __future__ import annotations

import dataclasses

from classifier.policy import BackendState, LiveState, Route


def foreign(state: LiveState) -> bool:
    """A scrape shows requests on the pair that this gateway did not send."""
    return any((state.of(route).others or 0) > 0 for route in Route)


def whole_servers(state: LiveState) -> LiveState:
    """`state` as the servers carry it, where others' requests are on them (see above)."""
    if not foreign(state):
        return state
    return LiveState(speculative=_whole(state.speculative), baseline=_whole(state.baseline))


def _whole(backend: BackendState) -> BackendState:
    return dataclasses.replace(backend, inflight=backend.load, others=0, last_start=0)
