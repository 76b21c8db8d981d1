"""deploy/gpu/routes.py: how launch.sh reads a list of speculation configurations,
and the gateway config it writes for them (loaded with the gateway's own loader)."""

from __future__ import annotations

import json
import tomllib

import pytest

from classifier.types import Route
from deploy.gpu import sizing
from deploy.gpu.routes import RouteError, gateway_toml, parse_route, place
from gateway.config import parse_config


@pytest.mark.parametrize(
    ("text", "name", "method", "k"),
    [
        ("none", "none", "none", 0),
        ("baseline=none", "baseline", "none", 0),
        ("ngram:2", "ngram-k2", "ngram", 2),
        ("ngram", "ngram-k4", "ngram", 4),
        ("eagle3:7@/m/eagle3", "eagle3-k7", "eagle3", 7),
        ("draft", "draft-k4", "draft_model", 4),
        ("mtp", "mtp-k1", "mtp", 1),
        ("speculative=draft:5", "speculative", "draft_model", 5),
    ],
)
def test_route_names_methods_and_k(text: str, name: str, method: str, k: int) -> None:
    route = parse_route(text, draft="/m/draft")
    assert (route.name, route.method, route.k) == (name, method, k)
    if method == "none":
        assert route.config == ""
    else:
        config = json.loads(route.config)
        assert config["method"] == method and config["num_speculative_tokens"] == k


def test_a_whole_speculative_config() -> None:
    route = parse_route('fast={"method": "mtp", "num_speculative_tokens": 2}')
    assert (route.name, route.method, route.k) == ("fast", "mtp", 2)
    assert json.loads(route.config) == {"method": "mtp", "num_speculative_tokens": 2}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("eagle3:3", "needs a draft folder"),
        ("medusa:2", "is not one of"),
        ("none:2", "no k"),
        ("ngram:0", "k must be"),
        ("Fast=ngram:2", "lower-case"),
        ("x={not json", "not JSON"),
        ("gateway=none", "is taken"),
    ],
)
def test_bad_routes(text: str, why: str) -> None:
    with pytest.raises(RouteError, match=why):
        parse_route(text)


def test_place_round_robin_over_gpus_in_waves() -> None:
    routes = [parse_route(t) for t in ("none", "ngram:2", "ngram:4", "ngram:8")]
    placed, plans = place(routes, target_gib=15, gpu_gib=140.0, ports=[1, 2, 3, 4], gpus=["0", "1"])
    assert [(p.gpu, p.wave) for p in placed] == [("0", 0), ("1", 0), ("0", 1), ("1", 1)]
    assert len(plans) == 2
    assert [s.name for s in plans[0].shares] == ["none", "ngram-k4"]
    with pytest.raises(RouteError, match="repeat"):
        place(routes[:1] * 2, target_gib=15, gpu_gib=140.0, ports=[1, 2])
    with pytest.raises(sizing.SizingError, match="does not fit"):
        place(routes, target_gib=30, gpu_gib=80.0, ports=[1, 2, 3, 4])


def test_the_gateway_config_loads_with_its_routes_in_order() -> None:
    routes = [parse_route(t, draft="/m/head") for t in ("none", "eagle3:3", "ngram:8")]
    placed, _ = place(routes, target_gib=15, gpu_gib=None, ports=[8001, 8002, 8003],
                      utils=[0.3, 0.3, 0.3])  # fmt: skip
    config = parse_config(tomllib.loads(gateway_toml(placed, "127.0.0.1")))
    assert list(config.routes) == ["none", "eagle3-k3", "ngram-k8"]
    eagle = config.routes[Route("eagle3-k3")]
    assert (eagle.method, eagle.num_speculative_tokens) == ("eagle3", 3)
    assert tuple(eagle.urls) == ("http://127.0.0.1:8002",)
    assert [spec.k for spec in config.route_specs] == [0, 3, 8]
    assert {c.device for c in config.routes.values()} == {""}  # one GPU: nothing to say


def test_on_several_gpus_the_gateway_config_names_each_routes_device() -> None:
    routes = [parse_route(t) for t in ("none", "ngram:2", "ngram:4")]
    placed, _ = place(routes, target_gib=15, gpu_gib=140.0, ports=[1, 2, 3], gpus=["0", "1"])
    config = parse_config(tomllib.loads(gateway_toml(placed, "127.0.0.1")))
    devices = {name: c.device for name, c in config.routes.items()}
    assert devices == {"none": "gpu0", "ngram-k2": "gpu1", "ngram-k4": "gpu0"}
