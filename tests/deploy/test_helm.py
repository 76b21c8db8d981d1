"""deploy/helm/specroute: `helm lint` passes; `helm template` output validates against
the schemas the k8s tests use (Kubernetes 1.31 and 1.37 for built-in kinds, the vendored
CRDs for the others, strict); the chart renders the same objects as each kustomize
layout of deploy/k8s for the matching values; N routes in values give N of every
route's objects, wired as the layouts wire them; bad values fail with a message."""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.config import Config, parse_config
from tests.deploy.conftest import DEPLOY, run
from tests.deploy.test_k8s import K8S, Obj, container, kustomize, one, pod_labels, selects
from tests.deploy.test_k8s_envoy_gateway import check_header_rules, validate
from tests.support import require_tool

CHART = DEPLOY / "helm" / "specroute"
ROUTES_VALUES = DEPLOY / "helm" / "examples" / "routes.yaml"
OLDEST_K8S = "1.31.0"  # deploy/README.md's minimum; Chart.yaml's kubeVersion
HOW = "bash deploy/helm/install_helm.sh links it into .venv/bin (scripts/test.sh's setup)"
ENVOY = ["--set", "envoyGateway.enabled=true"]

# The chart's values for each kustomize layout (deploy/k8s/monitoring goes beside another).
LAYOUTS: dict[str, tuple[list[str], list[Path]]] = {
    "gateway": ([], [K8S]),
    "routes": (["-f", str(ROUTES_VALUES)], [K8S / "routes"]),
    "envoy-gateway": (ENVOY, [K8S / "envoy-gateway"]),
    "envoy-gateway-routes": ([*ENVOY, "-f", str(ROUTES_VALUES)], [K8S / "envoy-gateway-routes"]),
    "monitoring": (["--set", "monitoring.enabled=true"], [K8S, K8S / "monitoring"]),
}

# What differs between the two on purpose, ignored by the comparison, and nothing else:
# - the labels Helm's convention adds to every object's metadata;
HELM_LABELS = {"app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart"}
# - the pod template annotation that rolls the gateway and the picker when config.toml
#   changes, where kustomize puts a content hash in the ConfigMap's name instead;
ROLL_ANNOTATION = "checksum/config"
HASHED_CONFIG_NAME = re.compile(r"\bspecroute-config-[a-z0-9]{10}\b")
# - the Namespace: kustomize makes it, Helm installs into one (-n, --create-namespace);
NOT_IN_THE_CHART = {("Namespace", "specroute")}
# - config.toml's text: compared as the gateway loads it (the pair's kustomize file
#   names [backends.speculative]/[backends.baseline], the chart writes [routes.NAME]).


def helm(*args: str) -> str:
    res = run([require_tool("helm", HOW), *args], timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


def helm_fails(*args: str) -> str:
    res = run([require_tool("helm", HOW), *args], timeout=60)
    assert res.returncode != 0, f"helm {' '.join(args)} rendered:\n{res.stdout}"
    return res.stderr


def template(*values: str) -> list[Obj]:
    out = helm("template", "specroute", str(CHART), "--namespace", "specroute", *values)
    return [d for d in yaml.safe_load_all(out) if d]


def loaded(config_toml: str) -> Config:
    """The config as the gateway uses it: the routes resolved, whichever tables named them."""
    config = parse_config(tomllib.loads(config_toml))
    backends = dataclasses.replace(config.backends, speculative=None, baseline=None)
    return dataclasses.replace(config, backends=backends)


def normalized(obj: Obj) -> tuple[tuple[str, str], Obj]:
    """(kind, name) and the object without the differences listed above."""
    obj = json.loads(HASHED_CONFIG_NAME.sub("specroute-config", json.dumps(obj)))
    labels = obj["metadata"].get("labels", {})
    for label in HELM_LABELS:
        labels.pop(label, None)
    pod = obj.get("spec", {}).get("template", {}).get("metadata", {})
    pod.get("annotations", {}).pop(ROLL_ANNOTATION, None)
    if pod.get("annotations") == {}:
        del pod["annotations"]
    if obj["kind"] == "ConfigMap":
        obj["data"]["config.toml"] = loaded(obj["data"]["config.toml"])
    return (obj["kind"], obj["metadata"]["name"]), obj


def by_name(objects: list[Obj]) -> dict[tuple[str, str], Obj]:
    named = dict(map(normalized, objects))
    assert len(named) == len(objects), "two objects of one kind and name"
    return named


def check_validates(objects: list[Obj]) -> None:
    """Every object against the newest schemas (built in) or its CRD, and the built-in
    kinds against the oldest Kubernetes the chart admits too."""
    for obj in objects:
        validate(obj)
        if "." not in obj["apiVersion"].split("/")[0]:
            kubernetes_validate.validate(obj, OLDEST_K8S, strict=True)
        assert obj["metadata"]["namespace"] == "specroute"
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "specroute"


@pytest.mark.parametrize("values", [[], *(v for v, _ in LAYOUTS.values() if v)])
def test_helm_lint(values: list[str]) -> None:
    out = helm("lint", "--strict", str(CHART), *values)
    assert "1 chart(s) linted, 0 chart(s) failed" in out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_chart_renders_what_kustomize_renders(layout: str) -> None:
    values, roots = LAYOUTS[layout]
    chart = template(*values)
    check_validates(chart)
    layouts = [obj for root in roots for obj in kustomize(root)]
    expected = {k: v for k, v in by_name(layouts).items() if k not in NOT_IN_THE_CHART}
    got = by_name(chart)
    assert sorted(got) == sorted(expected)
    for key, obj in expected.items():
        assert got[key] == obj, f"{key}: the chart's differs from kustomize's"


def test_the_comparison_sees_a_difference() -> None:
    """A changed spec field is no ignored difference."""
    chart = template("--set", "vllm.shmSize=4Gi")
    layout = by_name(kustomize(K8S))
    assert (
        by_name(chart)[("Deployment", "vllm-baseline")] != layout[("Deployment", "vllm-baseline")]
    )


def values_file(tmp_path: Path, values: Obj) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


# Five served routes on two GPUs, and one server the chart does not run.
FIVE: list[Obj] = [
    {"name": "plain", "method": "none", "gpuMemoryUtilization": "0.3", "device": 0},
    {"name": "ngram-k2", "method": "ngram", "k": 2, "gpuMemoryUtilization": "0.2",
     "speculativeConfig": {"prompt_lookup_max": 3}},
    {"name": "eagle3-k5", "method": "eagle3", "k": 5, "draft": "/models/eagle",
     "gpuMemoryUtilization": "0.2"},
    {"name": "solo", "method": "none", "gpuMemoryUtilization": "0.9", "device": 1},
    {"name": "mtp-k1", "method": "mtp", "k": 1, "gpuMemoryUtilization": "0.05", "device": 1},
]  # fmt: skip
ELSEWHERE: Obj = {"name": "llm-d", "method": "none", "url": "http://llm-d-gateway.llm-d:80"}


def _vllm_flags(dep: Obj) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in container(dep)["args"] if "=" in a)


def test_n_routes_give_n_servers_wired_as_the_layouts(tmp_path: Path) -> None:
    routes = [*FIVE, ELSEWHERE]
    objects = template(
        "-f", values_file(tmp_path, {"routes": routes}), "--set", "monitoring.enabled=true"
    )
    check_validates(objects)
    served = [r["name"] for r in FIVE]
    for kind in ("Deployment", "Service"):
        names = {o["metadata"]["name"] for o in objects if o["kind"] == kind}
        assert {n for n in names if n.startswith("vllm-")} == {f"vllm-{r}" for r in served}
    config = loaded(one(objects, "ConfigMap", "specroute-config")["data"]["config.toml"])
    assert [str(r) for r in config.routes] == [r["name"] for r in routes]
    assert config.routes["llm-d"].urls == (ELSEWHERE["url"],)  # type: ignore[index]
    devices = {str(name): c.device for name, c in config.routes.items()}
    assert devices == {"plain": "0", "ngram-k2": "0", "eagle3-k5": "0", "solo": "1",
                       "mtp-k1": "1", "llm-d": "llm-d"}  # fmt: skip
    for route in FIVE:
        dep = one(objects, "Deployment", f"vllm-{route['name']}")
        svc = one(objects, "Service", f"vllm-{route['name']}")
        assert selects(svc["spec"]["selector"], pod_labels(dep))
        assert config.routes[route["name"]].urls == (f"http://vllm-{route['name']}:8000",)
        flags = _vllm_flags(dep)
        assert flags["gpu-memory-utilization"] == route["gpuMemoryUtilization"]
        k = config.routes[route["name"]].num_speculative_tokens
        if route["method"] == "none":
            assert k == 0 and "speculative-config" not in flags
            continue
        spec = json.loads(flags["speculative-config"])
        assert spec["method"] == route["method"] and spec["num_speculative_tokens"] == k
        assert spec.get("model") == route.get("draft")
        assert flags["per-request-spec-decode-metrics"] == "detailed"
    assert json.loads(_vllm_flags(one(objects, "Deployment", "vllm-ngram-k2"))["speculative-config"])["prompt_lookup_max"] == 3  # fmt: skip
    # One GPU per device: each server waits for the previous one of its device and has
    # affinity to that device's first; a device's first waits for nobody.
    for first, *rest in (["plain", "ngram-k2", "eagle3-k5"], ["solo", "mtp-k1"]):
        assert "initContainers" not in one(objects, "Deployment", f"vllm-{first}")["spec"]["template"]["spec"]  # fmt: skip
        for before, name in zip([first, *rest], rest, strict=False):
            spec = one(objects, "Deployment", f"vllm-{name}")["spec"]["template"]["spec"]
            (term,) = spec["affinity"]["podAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]
            assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == first
            assert f"http://vllm-{before}:8000/health" in spec["initContainers"][0]["command"][-1]
    monitor = one(objects, "ServiceMonitor", "vllm")
    relabel = monitor["spec"]["endpoints"][0]["relabelings"][0]
    assert all(re.fullmatch(relabel["regex"], r["name"]) for r in routes)


def test_n_routes_behind_envoy_gateway(tmp_path: Path) -> None:
    objects = template(*ENVOY, "-f", values_file(tmp_path, {"routes": FIVE}))
    check_validates(objects)
    check_header_rules(objects, {r["name"] for r in FIVE}, default="plain")
    assert ("Deployment", "specroute-gateway") not in by_name(objects)


SPEC: Obj = {"name": "speculative", "method": "ngram", "k": 2, "gpuMemoryUtilization": "0.4"}
BASE: Obj = {"name": "baseline", "method": "none", "gpuMemoryUtilization": "0.5"}
EG: Obj = {"envoyGateway": {"enabled": True}}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({**EG, "routes": [SPEC, {**SPEC, "name": "mtp", "method": "mtp"}]},
         "one route must have method none"),
        ({**EG, "routes": [SPEC, {**BASE, "url": "http://elsewhere:8000"}]}, "drop url/service"),
        ({"gateway": {"terminationGracePeriodSeconds": 60}}, "must exceed preStopSeconds"),
        ({"routes": [{**SPEC, "name": "Spec_Route"}, BASE]}, "routes.0.name"),
        ({"routes": [SPEC, {**BASE, "gpuMemoryUtilisation": "0.5"}]},
         "gpuMemoryUtilisation is not allowed"),
        ({"routes": [{**SPEC, "k": 0}, BASE]}, "a route speculates (a method and k >= 1)"),
        ({"routes": [SPEC, {**BASE, "k": 2}]}, "a route speculates (a method and k >= 1)"),
    ],
)  # fmt: skip
def test_bad_values_fail_with_a_message(tmp_path: Path, values: Obj, message: str) -> None:
    values_path = values_file(tmp_path, values)
    assert message in helm_fails("template", "specroute", str(CHART), "-f", values_path)


def test_the_rules_are_the_prometheus_rules() -> None:
    """files/rules is a link to deploy/prometheus/rules: one copy of the alert rules."""
    link = CHART / "files" / "rules"
    assert link.is_symlink() and link.resolve() == (DEPLOY / "prometheus" / "rules").resolve()


def test_the_installer_is_shellcheck_clean() -> None:
    shellcheck = require_tool("shellcheck", "Debian package shellcheck (scripts/test.sh)")
    res = run([shellcheck, str(DEPLOY / "helm" / "install_helm.sh")])
    assert res.returncode == 0, res.stdout


def _minimum(tool: str) -> str:
    """The minimum version deploy/README.md states for `tool`."""
    text = (DEPLOY / "README.md").read_text()
    paragraph = text.split("**Minimum versions**", 1)[1].split("\n\n", 1)[0]
    found = re.search(rf"{tool} (\d+\.\d+)", paragraph)
    assert found, f"deploy/README.md's minimum versions name no {tool}"
    return found.group(1)


def test_the_stated_minimum_versions_are_the_tested_ones() -> None:
    assert helm("version", "--template", "{{.Version}}").startswith(f"v{_minimum('Helm')}.")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={_minimum('Kubernetes')}.0-0"
    assert OLDEST_K8S.startswith(f"{_minimum('Kubernetes')}.")
    kubectl = require_tool("kubectl-1.31", HOW)
    out: Any = json.loads(run([kubectl, "version", "--client", "-o", "json"]).stdout)
    assert f"{out['clientVersion']['major']}.{out['clientVersion']['minor']}" == _minimum("kubectl")
