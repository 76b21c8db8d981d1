"""deploy/k8s/routes: the layout with three routes of one model on one GPU (none,
ngram-k4, eagle3-k3). `kubectl kustomize` renders it; every object validates against
Kubernetes' schemas; the pair's Deployments and Services are gone; the gateway's
[routes.NAME] tables reach one Service and Deployment each (the component label is
the route's name, Prometheus's `route`), with the route's method and k in its
--speculative-config; the servers start one after another on the node of the first,
with sizing.py's memory split."""

from __future__ import annotations

import json
import tomllib

import pytest

from deploy.gpu import sizing
from gateway.config import parse_config
from tests.deploy.test_k8s import K8S, Obj, container, kustomize, one, pod_labels, selects
from tests.deploy.test_k8s_envoy_gateway import validate

ROUTES = K8S / "routes"
NAMES = ["none", "ngram-k4", "eagle3-k3"]


@pytest.fixture(scope="module")
def rendered() -> list[Obj]:
    return kustomize(ROUTES)


def _flags(dep: Obj) -> dict[str, str]:
    args = container(dep)["args"]
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


def _config(objects: list[Obj]) -> dict[str, object]:
    cm = one(objects, "ConfigMap", "specroute-config-")
    return tomllib.loads(cm["data"]["config.toml"])


def test_renders_and_validates_without_the_pair(rendered: list[Obj]) -> None:
    for obj in rendered:
        validate(obj)
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "specroute"
    servers = {o["metadata"]["name"] for o in rendered if o["kind"] in ("Deployment", "Service")}
    assert servers == {"specroute-gateway", *(f"vllm-{n}" for n in NAMES)}


def test_every_route_reaches_its_own_server(rendered: list[Obj]) -> None:
    config = parse_config(_config(rendered))
    assert list(config.routes) == NAMES
    for name, route in config.routes.items():
        svc = one(rendered, "Service", f"vllm-{name}")
        (url,) = route.urls
        assert url == f"http://vllm-{name}:{svc['spec']['ports'][0]['port']}"
        deps = [
            o for o in rendered
            if o["kind"] == "Deployment" and selects(svc["spec"]["selector"], pod_labels(o))
        ]  # fmt: skip
        assert [d["metadata"]["name"] for d in deps] == [f"vllm-{name}"]
        assert pod_labels(deps[0])["app.kubernetes.io/component"] == name  # Prometheus's route
        flags = _flags(deps[0])
        if route.method == "none":
            assert "speculative-config" not in flags
        else:
            spec = json.loads(flags["speculative-config"])
            assert (spec["method"], spec["num_speculative_tokens"]) == (
                route.method,
                route.num_speculative_tokens,
            )
            assert flags["per-request-spec-decode-metrics"] == "detailed"


def test_one_gpu_one_server_after_another(rendered: list[Obj]) -> None:
    deps = [one(rendered, "Deployment", f"vllm-{n}") for n in NAMES]
    plan = sizing.plan_route_example(
        "H200", sizing.LLAMA_31_8B,
        [("none", None), ("ngram-k4", sizing.NGRAM), ("eagle3-k3", sizing.EAGLE3_LLAMA_8B)],
    )  # fmt: skip
    for dep, share in zip(deps, plan.shares, strict=True):
        assert float(_flags(dep)["gpu-memory-utilization"]) == share.gpu_memory_utilization
        assert dep["spec"]["strategy"]["type"] == "Recreate"
        assert container(dep)["resources"]["limits"]["nvidia.com/gpu"] == 1
    served = {_flags(d)["served-model-name"] for d in deps}
    assert len(served) == 1 and len({container(d)["args"][0] for d in deps}) == 1
    assert "initContainers" not in deps[0]["spec"]["template"]["spec"]
    for before, dep in zip(NAMES, deps[1:], strict=False):
        pod = dep["spec"]["template"]["spec"]
        (init,) = pod["initContainers"]
        assert f"http://vllm-{before}:8000/health" in init["command"][-1]
        (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "none"
