"""The DEFAULT policy (the cost model) in front of the real CPU vLLM pair: what it
learns there, and the routing that only that learning explains.

The gateway starts from config.toml's defaults: neutral acceptance priors (0.6
for every workload, which predicts speculation faster on an idle server for all
of them) and latency priors written for a GPU. On this pair (SmolLM2-135M,
n-gram speculation, k = 4, a core each) creative text at temperature 1.2
drafts from n-grams that the model almost never follows: the prior is wrong
for this engine, and the gateway must learn the opposite from what vLLM
reports per request. A prompt that makes the model repeat its context (the
tiny model does not follow edit instructions, so the test asks it to repeat a
function verbatim) is where n-gram speculation pays.

Needs SPECROUTE_VLLM_BACKENDS (deploy/cpu/run_tier.sh sets it).
"""

from __future__ import annotations

import itertools
from typing import Any

import aiohttp
import pytest

pytestmark = pytest.mark.vllm

FUNCTIONS = (
    '''def mean(values):
    """Return the arithmetic mean of a non-empty list of numbers."""
    total = 0.0
    for value in values:
        total += value
    return total / len(values)
''',
    '''def is_palindrome(text):
    """True if text reads the same forwards and backwards, ignoring case."""
    cleaned = text.lower()
    return cleaned == cleaned[::-1]
''',
    '''def clamp(value, low, high):
    """Limit value to the closed range [low, high]."""
    if value < low:
        return low
    if value > high:
        return high
    return value
''',
)
TOPICS = (
    "a lighthouse that dreams",
    "a cat who owns a bakery",
    "the last train to the moon",
    "a clock that runs backwards",
)
WARM_UP = 8  # requests of each kind before the routing is judged
JUDGED = 4


def repeat_code(i: int, model: str) -> dict[str, Any]:
    fn = FUNCTIONS[i % len(FUNCTIONS)]
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"Repeat this Python function exactly:\n\n{fn}"}],
        "temperature": 0,
        "max_tokens": 64,
    }


def creative(i: int, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {"role": "user", "content": f"Write a short surreal poem about {TOPICS[i % 4]}."}
        ],
        "temperature": 1.2,
        "seed": 100 + i,  # sampled, yet the same poems every run: the test does not draw
        "max_tokens": 48,
    }


async def _send(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[str, str]:
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
        return resp.headers["x-specroute-route"], resp.headers["x-specroute-reason"]


async def _believed(http: aiohttp.ClientSession, url: str) -> dict[str, dict[str, Any]]:
    async with http.get(f"{url}/stats") as resp:
        workloads: dict[str, dict[str, Any]] = (await resp.json())["workloads"]
        return workloads


# 24 requests one at a time: 2 to 11 s each on two shared cores (the CPU decides),
# past the 120 s default.
@pytest.mark.timeout(480)
async def test_the_cost_model_learns_this_engine_and_routes_by_it(
    cost_model_gateway: str, http: aiohttp.ClientSession, backends: Any
) -> None:
    url = cost_model_gateway
    first: dict[str, str] = {}
    for i in range(WARM_UP):  # one at a time: an idle pair, each request on its own
        for kind, make in (("code", repeat_code), ("creative", creative)):
            route, _ = await _send(http, url, make(i, backends.model))
            first.setdefault(kind, route)
    # The neutral prior predicts speculation faster for both at first: creative
    # text starts on the speculative server, which is what has to be unlearned.
    assert first["creative"] == "speculative"

    believed = await _believed(http, url)
    code, poem = believed["code"]["acceptance"], believed["creative"]["acceptance"]
    assert code["sources"] == ["per_request_metrics"], code
    assert poem["measured_rate"] is not None and poem["measured_rate"] < 0.15, poem
    assert poem["believed_rate"] < 0.2, poem  # the prior's rate is about 0.45
    assert code["believed_rate"] > 0.35, code

    judged: dict[str, list[tuple[str, str]]] = {"code": [], "creative": []}
    for i in itertools.islice(itertools.count(WARM_UP), JUDGED):
        for kind, make in (("code", repeat_code), ("creative", creative)):
            judged[kind].append(await _send(http, url, make(i, backends.model)))
    chosen = {k: [r for r, reason in v if reason != "explore"] for k, v in judged.items()}
    assert chosen["code"] and set(chosen["code"]) == {"speculative"}, judged
    assert chosen["creative"] and set(chosen["creative"]) == {"baseline"}, judged
