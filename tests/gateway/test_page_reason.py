"""The side-by-side page's own runs (x-specroute-client: ui) count under reason "ui",
a client's forced route under "override": clicks on the page are not override traffic."""

from __future__ import annotations

import aiohttp

from classifier.tokens import TokenCounter
from gateway.config import parse_config
from tooling.configured_stack import configured_stack

BODY = {"model": "emulated-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def test_the_pages_runs_and_a_clients_override_are_counted_apart(
    tokens: TokenCounter,
) -> None:
    config = parse_config(
        {
            "routes": {
                "none": {"urls": ["http://h:1"]},
                "ngram-k4": {
                    "urls": ["http://h:2"],
                    "method": "ngram",
                    "num_speculative_tokens": 4,
                },
            },
            "routing": {"profile": "off"},
        }
    )
    sent = [
        ({"x-specroute-route": "ngram-k4", "x-specroute-client": "ui"}, "ui"),
        ({"x-specroute-route": "none", "x-specroute-client": "ui"}, "ui"),
        ({"x-specroute-route": "none"}, "override"),
        ({"x-specroute-route": "none", "x-specroute-client": "my-app"}, "override"),
    ]
    async with (
        configured_stack(config, time_scale=0.05, tokens=tokens) as stack,
        aiohttp.ClientSession() as session,
    ):
        for headers, reason in sent:
            url = f"{stack.gateway}/v1/chat/completions"
            async with session.post(url, json=BODY, headers=headers) as resp:
                assert resp.status == 200
                assert resp.headers["x-specroute-reason"] == reason, headers
                await resp.read()
        async with session.get(f"{stack.gateway}/metrics") as resp:
            metrics = await resp.text()
    decisions = {
        line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("specroute_route_decisions_total{")
    }
    assert decisions == {
        'reason="ui",route="ngram-k4"': 1.0,
        'reason="ui",route="none"': 1.0,
        'reason="override",route="none"': 2.0,
    }, decisions
