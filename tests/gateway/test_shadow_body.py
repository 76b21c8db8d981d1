"""A request whose body json cannot write back: the shadow's copy is skipped, the
user's answer and its ending untouched.

The user's own request goes out as the client wrote it (validation.with_member);
a shadow's copy is re-serialised, and settle hands the record to the shadows in
the handler's finally, so a RecursionError there was an unhandled_error traceback
after every such answer.
"""

from __future__ import annotations

import json

import pytest
from structlog.testing import capture_logs

from classifier.tokens import TokenCounter
from gateway.app import create_app
from tests.gateway.conftest import ClientFactory, RawUpstreams, make_config
from tests.gateway.misbehaving_upstream import UNWRITABLE_IDS, UNWRITABLE_MEMBERS
from tests.gateway.test_shadow import STRUCTURED, shadows
from tests.support import wait_until


@pytest.mark.parametrize(
    "extra",
    UNWRITABLE_MEMBERS,
    ids=UNWRITABLE_IDS,
)
async def test_a_body_json_cannot_write_back_is_not_copied(
    aiohttp_client: ClientFactory, raw_upstreams: RawUpstreams, tokens: TokenCounter, extra: bytes
) -> None:
    spec, base = raw_upstreams
    config = make_config(spec.url, base.url, shadow={"share": 1.0})
    gateway = await aiohttp_client(create_app(config, tokens=tokens))
    sent = json.dumps(STRUCTURED)[:-1].encode() + b"," + extra + b"}"
    with capture_logs() as logs:
        resp = await gateway.post(
            "/v1/chat/completions", data=sent, headers={"Content-Type": "application/json"}
        )
        assert resp.status == 200 and resp.headers["x-specroute-route"] == "speculative"
        await resp.read()
        await wait_until(lambda: shadows(gateway, "skipped") == 1, "the copy to be skipped")
    assert not [e for e in logs if e["log_level"] in ("error", "critical")]
    assert not base.received
    assert [r.body for r in spec.received] == [sent]
