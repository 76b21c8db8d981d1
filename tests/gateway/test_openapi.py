"""The gateway's OpenAPI description: served, and its paths are the app's paths.

(tests/gateway/test_fuzz.py checks every fuzzed error against its Error schema.
Generating bodies from the schema with hypothesis-jsonschema 0.23.1 fails on
hypothesis 6.170: 'many' object has no attribute 'more'.)
"""

from __future__ import annotations

import json
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient

Client = TestClient[web.Request, web.Application]
SPEC = json.loads((Path(__file__).resolve().parents[2] / "gateway" / "openapi.json").read_text())


async def test_the_spec_is_served_and_matches_the_routes(gateway: Client) -> None:
    served = await (await gateway.get("/openapi.json")).json()
    assert served == SPEC
    routes = {r.resource.canonical for r in gateway.app.router.routes() if r.resource is not None}
    assert set(SPEC["paths"]) <= routes
