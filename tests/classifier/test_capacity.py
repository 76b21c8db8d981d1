"""A server decodes at most its capacity of sequences at once (vLLM's max_num_seqs, the
gateway's admission limit): past it a request waits, and the price says so."""

from __future__ import annotations

from classifier import BackendState, LiveState, Route, Workload
from classifier.router import ProfiledPolicy, RouterConfig
from classifier.types import two_routes
from tests.classifier.test_classifier_policy import features

SPEC, BASE = Route.SPECULATIVE, Route.BASELINE


def test_a_full_server_is_priced_with_its_queue() -> None:
    """On the built-in prior: the baseline holds 40 sequences of its 40 and 12 more
    wait (other clients'), the speculative server 30. Without a capacity the baseline's
    batch would just grow by 13; with it, its step stops growing at 40 and the request
    waits for 13 slots to free, a third of a life."""
    policy = ProfiledPolicy(RouterConfig(), routes=two_routes(4, 0.2))
    f = features(workload=Workload.CHAT, temperature=0.7, prompt_tokens=1500)

    def state(capacity: float | None) -> LiveState:
        return LiveState.pair(
            BackendState(inflight=30, running=30, capacity=capacity),
            BackendState(inflight=1, running=40, others=51, capacity=capacity),
        )

    unbounded, full = policy.predict(f, state(None)), policy.predict(f, state(40))
    assert full[SPEC] == unbounded[SPEC]  # 31 of 40: room, nothing changes
    assert full[BASE] > 1.15 * unbounded[BASE]  # 53 for 40 slots: 13 / 40 of a life
    # Below its capacity a server is priced as without one.
    roomy = LiveState.pair(
        BackendState(inflight=30, running=30, capacity=40),
        BackendState(inflight=20, running=20, capacity=40),
    )
    bare = LiveState.pair(
        BackendState(inflight=30, running=30), BackendState(inflight=20, running=20)
    )
    assert policy.predict(f, roomy) == policy.predict(f, bare)
