"""deploy/k8s/envoy-gateway-routes: Envoy Gateway and the picker in front of three routes
(none, ngram-k4, eagle3-k3). `kubectl kustomize` renders it; every object validates
(Kubernetes' schemas, the vendored CRDs); the pair's servers and pools are gone; the
picker reads the routes' config; the HTTPRoute matches the picker's header for each
configured route to that route's pool and server, and sends requests without it where
deploy/envoy/render.py sends them; the Envoy Gateway objects are ../envoy-gateway's and
the servers ../routes'."""

from __future__ import annotations

import tomllib

import pytest

from deploy.envoy.render import routes_of
from gateway.config import load_config
from tests.deploy.test_k8s import K8S, Obj, kustomize, one
from tests.deploy.test_k8s_envoy_gateway import (
    _picker_args,
    check_every_object_validates,
    check_header_rules,
    check_vllm_admits_the_picker_and_envoy_gateways_proxies,
)

OVERLAY = K8S / "envoy-gateway-routes"
CONFIG = K8S / "routes" / "servers" / "config.toml"


@pytest.fixture(scope="module")
def rendered() -> list[Obj]:
    return kustomize(OVERLAY)


def test_renders_and_validates_with_the_routes_for_the_pair(rendered: list[Obj]) -> None:
    check_every_object_validates(rendered)
    names = {(o["kind"], o["metadata"]["name"]) for o in rendered}
    routes = list(load_config(CONFIG).routes)
    assert {n for k, n in names if k == "Deployment"} == {
        "specroute-picker",
        *(f"vllm-{r}" for r in routes),
    }
    assert {n for k, n in names if k == "Service"} == {
        "specroute-picker",
        *(f"vllm-{r}" for r in routes),
    }
    assert ("PodDisruptionBudget", "specroute-gateway") not in names


def test_the_picker_reads_the_routes_config(rendered: list[Obj]) -> None:
    args = _picker_args(one(rendered, "Deployment", "specroute-picker"))
    assert args.mode == "pool"
    cm = one(rendered, "ConfigMap", "specroute-config-")
    assert cm["data"]["config.toml"] == CONFIG.read_text()


def test_each_route_header_reaches_its_pool_and_server(rendered: list[Obj]) -> None:
    routes, default = routes_of(tomllib.loads(CONFIG.read_text()))
    assert default == "none"  # the first route without speculation
    check_header_rules(rendered, set(routes), default)
    for name in routes:
        check_vllm_admits_the_picker_and_envoy_gateways_proxies(rendered, f"vllm-{name}")


def test_envoy_gateway_from_the_pairs_layout_servers_from_the_routes_layout(
    rendered: list[Obj],
) -> None:
    pair = {(o["kind"], o["metadata"]["name"]): o for o in kustomize(K8S / "envoy-gateway")}
    ours = {(o["kind"], o["metadata"]["name"]): o for o in rendered}
    standalone = {(o["kind"], o["metadata"]["name"]): o for o in kustomize(K8S / "routes")}
    for name in load_config(CONFIG).routes:
        for kind in ("Deployment", "Service"):
            assert ours[(kind, f"vllm-{name}")] == standalone[(kind, f"vllm-{name}")]
    for key in [
        ("Gateway", "specroute"),
        ("EnvoyProxy", "specroute-proxy"),
        ("EnvoyExtensionPolicy", "specroute-picker"),
        ("Service", "specroute-picker"),
        ("NetworkPolicy", "vllm-ingress-envoy-gateway"),
    ]:
        assert ours[key] == pair[key], key
    assert (
        ours[("HTTPRoute", "specroute")]["spec"]["parentRefs"]
        == (pair[("HTTPRoute", "specroute")]["spec"]["parentRefs"])
    )
