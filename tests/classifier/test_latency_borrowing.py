"""A route nobody sends traffic to learns from the one that gets it."""

from __future__ import annotations

import pytest

from classifier.latency import LatencyModel, LatencyPriors, RouteLoad
from classifier.policy import Route


def _streamed(
    model: LatencyModel, route: Route, prompt: int, out: int, batch: int, ttft: float, decode: float
) -> None:
    """One streamed answer with one token per step: ttft, then `decode` seconds more."""
    model.observe(route, RouteLoad(prompt, out, batch), duration_s=ttft + decode, ttft_s=ttft)


def _observe_baseline(model: LatencyModel, n: int, slowdown: float) -> None:
    priors = LatencyPriors()
    for i in range(n):
        prompt, out, batch = 100 + 10 * i, 100, 1 + i % 4
        ttft = slowdown * (priors.ttft_base_s + priors.prefill_s_per_token * prompt)
        decode = slowdown * (out - 1) * (priors.step_base_s + priors.step_per_seq_s * batch)
        _streamed(model, Route.BASELINE, prompt, out, batch, ttft, decode)


def test_an_unobserved_route_follows_the_observed_routes_scale() -> None:
    model = LatencyModel(LatencyPriors(), num_speculative_tokens=4, draft_cost_ratio=0.2)
    spec_before = model.predict(Route.SPECULATIVE, RouteLoad(200, 100, 1, tokens_per_step=2.0))
    _observe_baseline(model, 60, slowdown=0.5)  # the engine is twice as fast as the priors
    base_ratio = model.predict(Route.BASELINE, RouteLoad(200, 100, 1)) / LatencyModel(
        LatencyPriors(), 4, 0.2
    ).predict(Route.BASELINE, RouteLoad(200, 100, 1))
    spec_after = model.predict(Route.SPECULATIVE, RouteLoad(200, 100, 1, tokens_per_step=2.0))
    assert base_ratio == pytest.approx(0.5, rel=0.1)
    assert spec_after / spec_before == pytest.approx(base_ratio, rel=0.1)


def test_a_route_with_its_own_traffic_stands_on_its_own_fit() -> None:
    model = LatencyModel(LatencyPriors(), num_speculative_tokens=4, draft_cost_ratio=0.2)
    priors = LatencyPriors()
    for _ in range(200):  # the speculative route, exactly at its prior
        ttft = priors.ttft_base_s + priors.prefill_s_per_token * 100
        decode = 49 * (priors.step_base_s + priors.step_per_seq_s) * 1.8
        _streamed(model, Route.SPECULATIVE, 100, 50, 1, ttft, decode)
    at_prior = model.predict(Route.SPECULATIVE, RouteLoad(100, 50, 1))
    _observe_baseline(model, 200, slowdown=0.5)
    assert model.predict(Route.SPECULATIVE, RouteLoad(100, 50, 1)) == pytest.approx(
        at_prior, rel=0.05
    )


def test_a_starved_route_keeps_its_measured_ratio_to_the_other() -> None:
    """Speculative steps measured at 3x baseline's (the prior says 1.8x); when only the
    baseline is observed afterwards and turns out 2x slower, speculative follows that
    drift from ITS measurement, not from its prior."""
    model = LatencyModel(LatencyPriors(), num_speculative_tokens=4, draft_cost_ratio=0.2)
    priors = LatencyPriors()
    base_step = priors.step_base_s + priors.step_per_seq_s
    for _ in range(100):
        for route, step in ((Route.BASELINE, base_step), (Route.SPECULATIVE, 3 * base_step)):
            _streamed(model, route, 100, 51, 1, 0.05, 50 * step)
    before = model.predict(Route.SPECULATIVE, RouteLoad(100, 51, 1)) / model.predict(
        Route.BASELINE, RouteLoad(100, 51, 1)
    )
    _observe_baseline(model, 400, slowdown=2.0)
    after = model.predict(Route.SPECULATIVE, RouteLoad(100, 51, 1)) / model.predict(
        Route.BASELINE, RouteLoad(100, 51, 1)
    )
    assert before > 2.0
    assert after == pytest.approx(before, rel=0.15)
