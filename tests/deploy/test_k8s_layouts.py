"""deploy/k8s/replicas (several gateways sharing one profile file) and
deploy/k8s/monitoring (ServiceMonitors and a PrometheusRule for the Prometheus
Operator): `kubectl kustomize` renders each; built-in kinds validate against
Kubernetes' schemas, monitoring.coreos.com kinds against the CRDs in
tests/deploy/crds (strict: unknown fields are errors); and the references hold:
the replicas wait for, mount and load the file the profile Job writes, and
measure nothing themselves; the ServiceMonitors select the Services of both
layouts with the job names and `route` label the rules and the dashboard use;
the PrometheusRule is the rules file, each alert with its runbook section."""

from __future__ import annotations

import copy
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from deploy.prometheus import operator_rule
from gateway import cli
from gateway.config import Config, parse_config
from gateway.profiling import cli as profiling_cli
from tests.deploy.test_k8s import (
    K8S,
    RAW,
    Obj,
    container,
    kustomize,
    one,
    pdb_lets_a_drain_through,
    pod_labels,
    selects,
)
from tests.deploy.test_k8s_envoy_gateway import OVERLAY as ENVOY_GATEWAY
from tests.deploy.test_k8s_envoy_gateway import SCHEMAS, validate

REPLICAS = K8S / "replicas"
MONITORING = K8S / "monitoring"


@pytest.fixture(scope="module")
def replicas() -> list[Obj]:
    return kustomize(REPLICAS)


@pytest.fixture(scope="module")
def monitoring() -> list[Obj]:
    return kustomize(MONITORING)


def _volume_mounts(spec: Obj, c: Obj) -> dict[str, tuple[Obj, Obj]]:
    """mountPath -> (the mount, its volume)."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    return {m["mountPath"]: (m, volumes[m["name"]]) for m in c.get("volumeMounts", [])}


def _config_of(objects: list[Obj]) -> dict[str, Any]:
    cm = one(objects, "ConfigMap", "specroute-config-")
    return tomllib.loads(cm["data"]["config.toml"])


def test_replicas_render_and_validate(replicas: list[Obj]) -> None:
    for obj in replicas:
        validate(obj)
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "specroute"
    dep = one(replicas, "Deployment", "specroute-gateway")
    assert dep["spec"]["replicas"] >= 2
    pdb = one(replicas, "PodDisruptionBudget", "specroute-gateway")
    assert pdb_lets_a_drain_through(pdb, dep["spec"]["replicas"])
    assert not [o for o in replicas if o["kind"] == "HorizontalPodAutoscaler"]


def test_replicas_config_is_the_base_plus_the_shared_profile(replicas: list[Obj]) -> None:
    base = tomllib.loads((K8S / "gateway" / "config.toml").read_text())
    shared = _config_of(replicas)
    routing = shared.pop("routing")
    assert shared == base, "replicas/config.toml must equal gateway/config.toml but [routing]"
    assert routing == {"profile": "off", "profile_path": routing["profile_path"]}
    config = parse_config(_config_of(replicas))  # the gateway's own loader accepts it
    assert config.routing.profile == "off" and config.routing.profile_path


def _profile_command(job: Obj) -> list[str]:
    """The `specroute profile ...` line of the Job's shell script, with $PROFILE."""
    c = container(job, "profile")
    env = {e["name"]: e.get("value") for e in c["env"]}
    script = c["command"][-1]
    line = next(ln for ln in script.splitlines() if "specroute profile" in ln)
    words = shlex.split(line.replace('"$PROFILE"', env["PROFILE"]))
    return words[words.index("specroute") + 1 :]


def test_the_job_writes_the_file_every_replica_waits_for_and_loads(
    replicas: list[Obj], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = Path(parse_config(_config_of(replicas)).routing.profile_path)
    job = one(replicas, "Job", "specroute-profile")
    args = _profile_command(job)
    assert args[0] == "profile"
    # The Job's command line through the real CLI, with the ConfigMap's file here.
    config_arg = Path(args[args.index("--config") + 1])
    local = tmp_path / config_arg.name
    local.write_text(one(replicas, "ConfigMap", "specroute-config-")["data"][config_arg.name])
    ran: list[tuple[Config, Path | None, bool]] = []

    def run_profile(config: Config, out: Path | None, *, show: bool) -> int:
        ran.append((config, out, show))
        return 0

    monkeypatch.setattr(profiling_cli, "run_profile", run_profile)
    argv = [str(local) if a == str(config_arg) else a for a in args]
    assert cli.main(argv) == 0
    [(config, out, show)] = ran
    assert out == path and not show
    assert config.routing.profile_path == str(path)
    job_spec = job["spec"]["template"]["spec"]
    job_c = container(job, "profile")
    mount, volume = _volume_mounts(job_spec, job_c)[str(path.parent)]
    assert not mount.get("readOnly")
    claim = volume["persistentVolumeClaim"]["claimName"]
    pvc = one(replicas, "PersistentVolumeClaim", claim)
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]  # every replica's node reads it
    # The Job's --config is the ConfigMap's file.
    _, config_volume = _volume_mounts(job_spec, job_c)[str(config_arg.parent)]
    cm = one(replicas, "ConfigMap", "specroute-config-")
    assert config_volume["configMap"]["name"] == cm["metadata"]["name"]
    # Every replica: the same claim, read-only, at the configured place, and an init
    # container that waits for that very file.
    dep = one(replicas, "Deployment", "specroute-gateway")
    spec = dep["spec"]["template"]["spec"]
    gateway_mount, gateway_volume = _volume_mounts(spec, container(dep, "gateway"))[
        str(path.parent)
    ]
    assert gateway_mount["readOnly"] is True
    assert gateway_volume["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}
    wait = next(c for c in spec["initContainers"] if c["name"] == "wait-for-profile")
    assert str(path) in wait["command"][-1]
    assert str(path.parent) in _volume_mounts(spec, wait)
    # vLLM admits the Job (its pods' labels).
    admitted = [
        p["podSelector"]["matchLabels"]
        for o in replicas
        if o["kind"] == "NetworkPolicy"
        for rule in o["spec"]["ingress"]
        for p in rule["from"]
        if "podSelector" in p
    ]
    assert any(selects(sel, pod_labels(job)) for sel in admitted)
    # The Job's pods are no gateway: the Service does not send them requests.
    svc = one(replicas, "Service", "specroute-gateway")
    assert not selects(svc["spec"]["selector"], pod_labels(job))


def test_monitoring_renders_and_validates_against_the_crds(monitoring: list[Obj]) -> None:
    kinds = {(o["apiVersion"], o["kind"]) for o in monitoring}
    assert kinds == {
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule"),
    }
    assert kinds <= set(SCHEMAS)
    for obj in monitoring:
        validate(obj)
        assert obj["metadata"]["namespace"] == "specroute"


@pytest.mark.parametrize(
    ("kind", "edit"),
    [
        ("ServiceMonitor", lambda o: o["spec"]["endpoints"][0].update(intervall="15s")),
        ("ServiceMonitor", lambda o: o["spec"]["endpoints"][0].update(interval="15 s")),
        ("ServiceMonitor", lambda o: o["spec"].pop("selector")),  # required
        ("ServiceMonitor",
         lambda o: o["spec"]["endpoints"][0]["relabelings"][0].update(action="rename")),
        ("PrometheusRule", lambda o: o["spec"]["groups"][0]["rules"][0].pop("expr")),
        ("PrometheusRule", lambda o: o["spec"]["groups"][0]["rules"][0].update(four="2m")),
    ],
)  # fmt: skip
def test_a_wrong_monitoring_field_fails(monitoring: list[Obj], kind: str, edit: Any) -> None:
    bad = copy.deepcopy(next(o for o in monitoring if o["kind"] == kind))
    edit(bad)
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)


def test_service_monitors_scrape_the_jobs_the_rules_use(monitoring: list[Obj]) -> None:
    services = [o for o in [*RAW, *kustomize(ENVOY_GATEWAY)] if o["kind"] == "Service"]
    jobs: set[str] = set()
    for sm in (o for o in monitoring if o["kind"] == "ServiceMonitor"):
        selected = [s for s in services if selects(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]  # fmt: skip
        assert selected, f"ServiceMonitor {sm['metadata']['name']} selects no Service"
        for svc in selected:
            ports = {p["name"] for p in svc["spec"]["ports"]}
            assert {e["port"] for e in sm["spec"]["endpoints"]} <= ports
            jobs.add(svc["metadata"]["labels"][sm["spec"]["jobLabel"]])
        if any("vllm" in s["metadata"]["name"] for s in selected):
            relabel = next(
                r for e in sm["spec"]["endpoints"] for r in e["relabelings"]
                if r.get("targetLabel") == "route"
            )  # fmt: skip
            label = relabel["sourceLabels"][0].removeprefix("__meta_kubernetes_service_label_")
            values = {
                v
                for s in selected
                for k, v in s["metadata"]["labels"].items()
                if re.sub(r"[^a-zA-Z0-9_]", "_", k) == label  # Prometheus' sanitised name
            }
            assert values == {"speculative", "baseline"}
            assert all(re.fullmatch(relabel["regex"], v) for v in values)
    rules = (K8S.parent / "prometheus" / "rules" / "specroute-alerts.yml").read_text()
    used = set(re.findall(r'job="([^"]+)"', rules))
    assert used and used <= jobs, f"jobs the rules use but no ServiceMonitor makes: {used - jobs}"


def test_the_prometheus_rule_is_the_rules_file() -> None:
    path = MONITORING / "prometheusrule.yaml"
    assert path.read_text() == operator_rule.render(), (
        "run: python3 deploy/prometheus/operator_rule.py"
    )
