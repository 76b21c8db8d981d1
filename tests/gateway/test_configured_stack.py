"""`serve --emulate --config FILE`: the file's routes, each on emulated servers that run
what its table says, on one emulated GPU or the devices it names; the gateway over them
runs the file's own config and writes none of its files."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from classifier.tokens import TokenCounter
from classifier.types import Route
from gateway.cli import main
from gateway.config import parse_config
from tooling.configured_stack import banner, configured_stack

ROUTES = """
[routes.plain]
urls = ["http://gpu-a:8000"]
method = "none"
device = "a"
[routes.eagle-k3]
urls = ["http://gpu-a:8001"]
method = "eagle3"
num_speculative_tokens = 3
device = "a"
[routes.ngram-k5]
urls = ["http://gpu-b:8002"]
method = "ngram"
num_speculative_tokens = 5
device = "b"
"""


async def _get(session: aiohttp.ClientSession, url: str, **kw: Any) -> dict[str, Any]:
    async with session.get(url, **kw) as resp:
        assert resp.status == 200, (url, resp.status)
        body: dict[str, Any] = await resp.json()
        return body


async def test_each_route_runs_its_method_and_k_on_its_device(
    tokens: TokenCounter, tmp_path: Path
) -> None:
    log = tmp_path / "outcomes.jsonl"
    raw = tomllib.loads(ROUTES)
    raw |= {"routing": {"profile": "off"}, "outcome_log": {"path": str(log)}}
    config = parse_config(raw)
    async with (
        configured_stack(config, time_scale=0.05, tokens=tokens) as stack,
        aiohttp.ClientSession() as session,
    ):
        assert [r.value for r in stack.config.routes] == ["plain", "eagle-k3", "ngram-k5"]
        assert {r.value: g for r, g in stack.gpus.items()} == {
            "plain": ("a",),
            "eagle-k3": ("a",),
            "ngram-k5": ("b",),
        }
        knobs = {r.value: (e.mode, e.num_speculative_tokens) for r, e in stack.emulators.items()}
        assert knobs["eagle-k3"] == ("speculative", 3) and knobs["ngram-k5"] == ("speculative", 5)
        assert knobs["plain"][0] == "baseline"
        assert stack.emulators[Route("ngram-k5")].drafter == "ngram"
        for route, drafter in (("eagle-k3", "eagle3 k=3"), ("ngram-k5", "ngram k=5")):
            url = stack.config.routes[Route(route)].urls[0]
            version = await _get(session, f"{url}/version")
            assert version["emulated"]["gpu"].endswith(f"drafter {drafter}"), version
        head, *routes, tail = banner(stack).splitlines()
        assert "EMULATED" in head and "measured GPU h200-llama3.1-8b" in head
        assert "drafter" not in head  # the GPU, not one route's drafter
        assert routes[0].startswith("  plain (no speculation): http://127.0.0.1:")
        assert routes[1].startswith("  eagle-k3 (eagle3 k=3, drafter eagle3): http://")
        assert routes[2].endswith(" on emulated GPU b")
        assert tail.startswith("Not written: outcome_log.path, record.path")
        stats = await _get(session, f"{stack.gateway}/stats")
        assert [(r["name"], r["method"], r["num_speculative_tokens"]) for r in stats["routes"]] == [
            ("plain", "none", 0),
            ("eagle-k3", "eagle3", 3),
            ("ngram-k5", "ngram", 5),
        ]
        body = {"model": "emulated-model", "messages": [{"role": "user", "content": "hi"}]}
        async with session.post(
            f"{stack.gateway}/v1/chat/completions", json=body | {"max_tokens": 4}
        ) as resp:
            assert resp.status == 200
            assert resp.headers["x-specroute-route"] in ("plain", "eagle-k3", "ngram-k5")
            await resp.read()
    assert not log.exists()  # the config's outcome log is a real run's: not written


def test_a_method_the_gpu_profile_did_not_measure_is_named_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "routes.toml"
    path.write_text(
        ROUTES.replace('"eagle3"', '"medusa"').replace('"ngram"', '"suffix"')
        + "[server]\nport = 1\n"
    )
    assert main(["serve", "--emulate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "[routes.eagle-k3] method 'medusa': GPU profile h200-llama3.1-8b measured no" in err
    assert "[routes.ngram-k5] method 'suffix'" in err
    assert "methods it has: draft_model (draft-1b), eagle3 (eagle3), ngram (ngram)" in err


async def test_by_index_pairs_put_server_i_of_every_route_on_gpu_i(tokens: TokenCounter) -> None:
    config = parse_config(
        {
            "routes": {
                "base": {"urls": ["http://h:1", "http://h:2"]},
                "ngram-k4": {
                    "urls": ["http://h:3", "http://h:4"],
                    "method": "ngram",
                    "num_speculative_tokens": 4,
                },
            },
            "backends": {"pairs": "by-index"},
            "routing": {"profile": "off"},
        }
    )
    async with configured_stack(config, time_scale=0.05, tokens=tokens) as stack:
        assert {r.value: g for r, g in stack.gpus.items()} == {
            "base": ("gpu:0", "gpu:1"),
            "ngram-k4": ("gpu:0", "gpu:1"),
        }
        assert all(len(c.urls) == 2 for c in stack.config.routes.values())


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpu-profile", "h100-nothing"], "no GPU profile 'h100-nothing'"),
        (["--drafter", "eagle3"], "--drafter: with --config each route's method names"),
    ],
)
def test_the_emulate_flags_with_a_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    path = tmp_path / "routes.toml"
    path.write_text(ROUTES + "[server]\nport = 1\n")
    assert main(["serve", "--emulate", "--config", str(path), *flags]) == 2
    assert message in capsys.readouterr().err
