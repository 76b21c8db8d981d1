"""The health prober is supervised as the scraper is: an endpoint whose probe raises is
logged and leaves the others' health current, and a round that raises is logged and the
prober starts again, so an endpoint that goes down is still seen to (issue 50)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

import gateway.backends.pool as pool_module
from classifier.tokens import TokenCounter
from classifier.types import Route
from gateway.app import create_app
from gateway.backends.models import model_cards
from gateway.state import BACKENDS
from tests.gateway.conftest import ClientFactory, make_config
from tests.gateway.fake_upstream import FakeUpstream
from tests.support import wait_until

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def gateway(
    aiohttp_client: ClientFactory,
    spec_server: TestServer,
    base_server: TestServer,
    tokens: TokenCounter,
) -> AsyncIterator[Client]:
    config = make_config(
        str(spec_server.make_url("")),
        str(base_server.make_url("")),
        upstream={"health_interval_s": 0.05},
    )
    yield await aiohttp_client(create_app(config, tokens=tokens))


async def test_an_endpoint_whose_probe_raises_leaves_the_others_probed(
    aiohttp_client: ClientFactory,
    spec_server: TestServer,
    base_server: TestServer,
    base_upstream: FakeUpstream,
    tokens: TokenCounter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A speculative server whose models answer breaks the probe, every time. Before: the
    prober's one task died at the first, unseen until shutdown, and every endpoint kept
    the health it had then (the baseline going down went unnoticed)."""
    spec_url = str(spec_server.make_url(""))
    raised = 0

    async def breaks_on_spec(
        session: Any, url: str, *args: Any, **kwargs: Any
    ) -> dict[str, dict[str, Any]] | None:
        nonlocal raised
        if url == spec_url:
            raised += 1
            raise RuntimeError("a models list the parser did not foresee")
        return await model_cards(session, url, *args, **kwargs)

    monkeypatch.setattr(pool_module, "model_cards", breaks_on_spec)
    config = make_config(
        spec_url, str(base_server.make_url("")), upstream={"health_interval_s": 0.05}
    )
    with capture_logs() as logs:
        gateway: Client = await aiohttp_client(create_app(config, tokens=tokens))
        await wait_until(lambda: raised >= 2, "the probes that raise")
        base_upstream.healthy = False  # news the prober must still bring
        pool = gateway.app[BACKENDS]
        (base,) = pool.of(Route.BASELINE).upstreams
        await wait_until(lambda: not base.healthy, "the baseline seen down", timeout_s=5)
    (spec,) = pool.of(Route.SPECULATIVE).upstreams
    assert spec.healthy  # no news of it: as it was
    failed = [line for line in logs if line["event"] == "health_probe_failed"]
    assert failed and all(line["route"] == "speculative" for line in failed)
    assert failed[0]["log_level"] == "error" and failed[0]["exc_info"] is True


async def test_a_round_that_raises_is_logged_and_the_prober_starts_again(
    gateway: Client, base_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = gateway.app[BACKENDS]
    export_up = pool._export_up
    calls = 0

    def breaks_once() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a gauge that would not take its value")
        export_up()

    with capture_logs() as logs:
        monkeypatch.setattr(pool, "_export_up", breaks_once)
        await wait_until(lambda: calls >= 1, "the round that raises")
        base_upstream.healthy = False
        (base,) = pool.of(Route.BASELINE).upstreams
        await wait_until(lambda: not base.healthy, "the baseline seen down", timeout_s=5)
    failed = [line for line in logs if line["event"] == "background_task_failed"]
    assert len(failed) == 1 and failed[0]["task"] == "health_prober"
    assert failed[0]["log_level"] == "error" and failed[0]["exc_info"] is True
