"""The health prober is supervised as the scraper is: a round that raises is logged and
the prober goes on, so an endpoint that goes down is still seen to (issue 50)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

import gateway.backends.pool as pool_module
from classifier.types import Route
from gateway.app import create_app
from gateway.backends.models import model_cards
from gateway.state import BACKENDS
from tests.gateway.conftest import ClientFactory, make_config
from tests.gateway.fake_upstream import FakeUpstream
from tests.support import wait_until

Client = TestClient[web.Request, web.Application]


async def test_a_probe_round_that_raises_is_logged_and_probing_goes_on(
    aiohttp_client: ClientFactory,
    spec_server: object,
    base_server: object,
    base_upstream: FakeUpstream,
    tokens: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: the prober's one task died with the exception unseen until shutdown, and
    every endpoint kept the health it had then (a server that went down stayed in)."""
    raised = 0

    async def breaks_once(*args: Any, **kwargs: Any) -> dict[str, dict[str, Any]] | None:
        nonlocal raised
        if raised == 0:
            raised += 1
            raise RuntimeError("a models list the parser did not foresee")
        return await model_cards(*args, **kwargs)

    monkeypatch.setattr(pool_module, "model_cards", breaks_once)
    config = make_config(
        str(spec_server.make_url("")),  # type: ignore[attr-defined]
        str(base_server.make_url("")),  # type: ignore[attr-defined]
        upstream={"health_interval_s": 0.05},
    )
    with capture_logs() as logs:
        gateway: Client = await aiohttp_client(create_app(config, tokens=tokens))  # type: ignore[arg-type]
        await wait_until(lambda: raised, "the probe that raises")
        base_upstream.healthy = False  # news the prober must still bring
        (endpoint,) = gateway.app[BACKENDS].of(Route.BASELINE).upstreams
        await wait_until(lambda: not endpoint.healthy, "the baseline seen down", timeout_s=5)
    failed = [line for line in logs if line["event"] == "background_task_failed"]
    assert len(failed) == 1 and failed[0]["task"] == "health_prober"
    assert failed[0]["log_level"] == "error" and failed[0]["exc_info"] is True
