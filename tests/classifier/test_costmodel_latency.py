"""latency.py: the online fit finds known true rates from noisy outcomes, and stays sane."""

from __future__ import annotations

import math
import random

import pytest

from classifier import Route
from classifier.latency import LatencyModel, LatencyPriors, RouteLoad

SPEC, BASE = Route.SPECULATIVE, Route.BASELINE
K, C = 4, 0.2

# The truth the fit must find; the priors it starts from are 2-3x off on purpose.
TRUTH = {
    BASE: (0.008, 0.00025, 0.0085, 0.00055, 0.05),
    SPEC: (0.0084, 0.00026, 0.0175, 0.0019, 0.05),
}
PRIORS = LatencyPriors(
    ttft_base_s=0.03,
    prefill_s_per_token=0.0006,
    step_base_s=0.02,
    step_per_seq_s=0.0012,
    queue_s_per_waiting=0.05,
)


def true_latency(
    route: Route, prompt: int, out: int, batch: int, waiting: int, tps: float
) -> tuple[float, float]:
    t0, p, s0, s1, q = TRUTH[route]
    ttft = t0 + p * prompt + q * waiting
    return ttft, ttft + (out - 1) / tps * (s0 + s1 * batch)


def sample(rng: random.Random) -> tuple[Route, int, int, int, int, float]:
    route = rng.choice((SPEC, BASE))
    tps = 1.0 + K * rng.uniform(0.2, 0.8) if route is SPEC else 1.0
    waiting = rng.choice((0, 0, 0, 0, 1, 3))
    return route, rng.randint(20, 6000), rng.randint(8, 600), rng.randint(1, 32), waiting, tps


def train(
    model: LatencyModel, rng: random.Random, n: int, *, streamed: float = 0.5, noise: float = 0.1
) -> None:
    for _ in range(n):
        route, prompt, out, batch, waiting, tps = sample(rng)
        ttft, total = true_latency(route, prompt, out, batch, waiting, tps)
        jitter = math.exp(rng.gauss(0, noise))
        model.observe(
            route,
            RouteLoad(prompt, out, batch, waiting, tps),
            duration_s=total * jitter,
            ttft_s=ttft * jitter if rng.random() < streamed else None,
        )


def mape(model: LatencyModel, rng: random.Random, route: Route, n: int = 2000) -> float:
    errors = []
    for _ in range(n):
        _, prompt, out, batch, waiting, tps = sample(rng)
        tps = tps if route is SPEC else 1.0
        _, truth = true_latency(route, prompt, out, batch, waiting, tps)
        errors.append(
            abs(model.predict(route, RouteLoad(prompt, out, batch, waiting, tps)) - truth) / truth
        )
    return sum(errors) / len(errors)


@pytest.mark.parametrize("streamed", [0.0, 0.5, 1.0])
def test_fit_converges_to_true_latency(streamed: float) -> None:
    rng = random.Random(1)
    model = LatencyModel(PRIORS, K, C)
    before = {r: mape(model, random.Random(2), r) for r in Route}
    train(model, rng, 600, streamed=streamed)
    after = {r: mape(model, random.Random(2), r) for r in Route}
    assert all(before[r] > 0.5 for r in Route)  # the priors really are wrong
    assert all(after[r] < 0.05 for r in Route), after  # noise is 10%, the fit is far better


def test_fitted_rates_are_the_true_ones() -> None:
    model = LatencyModel(PRIORS, K, C)
    train(model, random.Random(3), 3000, streamed=1.0, noise=0.05)
    for route, params in model.parameters().items():
        fitted = (params.prefill_s_per_token, params.step_base_s, params.step_per_seq_s)
        true = (TRUTH[route][1], TRUTH[route][2], TRUTH[route][3])
        for got, want in zip(fitted, true, strict=True):
            assert got == pytest.approx(want, rel=0.15), (route, fitted, true)
        assert params.samples > 1000


def test_spec_prior_pays_the_draft() -> None:
    params = LatencyModel(PRIORS, K, C).parameters()
    assert params[SPEC].step_base_s == pytest.approx(PRIORS.step_base_s * (1 + K * C))
    assert params[SPEC].step_per_seq_s == pytest.approx(PRIORS.step_per_seq_s * (1 + K * C))
    assert params[SPEC].prefill_s_per_token == params[BASE].prefill_s_per_token
    assert params[BASE].samples == 0


def test_tokens_per_step_divides_decode_time() -> None:
    model = LatencyModel(PRIORS, K, C)
    one = model.predict(SPEC, RouteLoad(0, 101, 1))
    three = model.predict(SPEC, RouteLoad(0, 101, 1, tokens_per_step=3.0))
    prefill = PRIORS.ttft_base_s
    assert three - prefill == pytest.approx((one - prefill) / 3)


def test_queueing_adds_per_waiting_request() -> None:
    model = LatencyModel(PRIORS, K, C)
    assert model.predict(BASE, RouteLoad(100, 50, 1, waiting=4)) - model.predict(
        BASE, RouteLoad(100, 50, 1)
    ) == pytest.approx(4 * PRIORS.queue_s_per_waiting)


def test_prompts_prefilling_ahead_delay_the_first_token() -> None:
    model = LatencyModel(PRIORS, K, C)
    ahead = model.predict(BASE, RouteLoad(100, 50, 1, prefill_ahead=3000))
    assert ahead - model.predict(BASE, RouteLoad(100, 50, 1)) == pytest.approx(
        3000 * PRIORS.prefill_s_per_token
    )


def test_the_fit_learns_prefill_from_requests_queued_behind_others() -> None:
    """Short prompts whose first token waited for a long prompt ahead of them: charged
    to the prompt they joined, they teach the prefill rate, not a bigger fixed cost."""
    model = LatencyModel(PRIORS, K, C)
    rng = random.Random(3)
    t0, p = TRUTH[BASE][:2]
    for _ in range(400):
        prompt, ahead = rng.randint(10, 60), rng.choice((0, 0, 0, 3000))
        ttft = t0 + p * (prompt + ahead)
        model.observe(
            BASE, RouteLoad(prompt, 1, 1, prefill_ahead=ahead), duration_s=ttft, ttft_s=ttft
        )
    fitted = model.parameters()[BASE]
    assert fitted.prefill_s_per_token == pytest.approx(p, rel=0.05)
    assert fitted.ttft_base_s == pytest.approx(t0, rel=0.2)


def test_one_outlier_cannot_wreck_the_fit() -> None:
    model = LatencyModel(PRIORS, K, C)
    train(model, random.Random(4), 800)
    probe = RouteLoad(500, 200, 8)
    before = model.predict(BASE, probe)
    model.observe(BASE, RouteLoad(500, 200, 8), duration_s=before * 200, ttft_s=None)
    assert model.predict(BASE, probe) == pytest.approx(before, rel=0.02)
    # Nonsense measurements are ignored outright.
    for bad in (0.0, -1.0, math.inf, math.nan):
        model.observe(BASE, RouteLoad(500, 200, 8), duration_s=bad, ttft_s=None)
    assert model.predict(BASE, probe) == pytest.approx(before, rel=0.02)


def test_rates_stay_within_max_factor_of_the_prior() -> None:
    model = LatencyModel(PRIORS, K, C)
    for _ in range(500):  # a backend 1000x slower than its prior says
        model.observe(BASE, RouteLoad(100, 100, 1), duration_s=1000.0, ttft_s=None)
    params = model.parameters()[BASE]
    assert params.step_base_s <= PRIORS.step_base_s * PRIORS.max_factor * (1 + 1e-9)
    assert params.ttft_base_s <= PRIORS.ttft_base_s * PRIORS.max_factor * (1 + 1e-9)
    assert min(params.step_base_s, params.ttft_base_s, params.prefill_s_per_token) > 0


def test_unexercised_rate_stays_at_its_prior() -> None:
    model = LatencyModel(PRIORS, K, C)
    rng = random.Random(5)
    for _ in range(1000):  # nothing ever waits: the queueing rate has no evidence
        route, prompt, out, batch, _, tps = sample(rng)
        ttft, total = true_latency(route, prompt, out, batch, 0, tps)
        model.observe(
            route, RouteLoad(prompt, out, batch, tokens_per_step=tps), duration_s=total, ttft_s=ttft
        )
    for params in model.parameters().values():
        assert params.queue_s_per_waiting == pytest.approx(PRIORS.queue_s_per_waiting, rel=0.05)


def test_forgets_a_changed_backend() -> None:
    model = LatencyModel(LatencyPriors(memory=300), K, C)
    for step in (0.01, 0.03):  # the backend becomes 3x slower per step
        for _ in range(1500):
            model.observe(BASE, RouteLoad(100, 101, 1), duration_s=0.02 + 100 * step, ttft_s=0.02)
    assert model.predict(BASE, RouteLoad(100, 101, 1)) == pytest.approx(0.02 + 100 * 0.03, rel=0.05)


@pytest.mark.parametrize(
    "bad",
    [
        {"step_base_s": 0.0},
        {"prefill_s_per_token": -1.0},
        {"ttft_base_s": math.nan},
        {"prior_weight": 0.0},
        {"memory": 0.5},
        {"max_factor": 1.0},
    ],
)
def test_priors_are_validated(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="latency priors"):
        LatencyPriors(**bad)
