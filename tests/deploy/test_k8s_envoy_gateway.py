"""deploy/k8s/envoy-gateway: `kubectl kustomize` renders it; the built-in kinds validate
against the Kubernetes 1.37 schemas (strict), the Gateway API, Inference Extension and
Envoy Gateway objects against their CRDs' openAPIV3Schema (vendored in
tests/deploy/crds, unknown fields are errors); and the references hold: the picker's
flags parse with the CLI's own parser, its config loads, its gRPC health probe names
the service the picker serves, the HTTPRoute matches the picker's header to the pool
of each route, each pool selects that route's vLLM pod on its port, the extension
policy calls the picker's Service in the bootstrap's processing modes, and the Gateway's
EnvoyProxy gives Envoy Gateway's own bootstrap the runtime flags of the shipped one
(checked under a real Envoy)."""

from __future__ import annotations

import argparse
import copy
import gzip
import json
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import kubernetes_validate
import pytest
import yaml

from classifier.types import PAIR
from deploy.envoy.render import POOL_BOOTSTRAP
from gateway.app import create_app
from gateway.cli import _add_ext_proc_arguments, apply_environment
from gateway.config import load_config
from gateway.extproc.server import SERVICE
from gateway.request.dispatch import ROUTE_HEADER
from tests.deploy.test_k8s import (
    K8S,
    K8S_VERSION,
    Obj,
    container,
    kustomize,
    one,
    pod_labels,
    selects,
)
from tooling.envoy import envoy_admin

OVERLAY = K8S / "envoy-gateway"
CRDS = Path(__file__).resolve().parent / "crds"
POOL = ("inference.networking.k8s.io", "InferencePool")


def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused wherever the CRD lists the fields (the API
    server prunes them; `kubectl apply --validate=strict` refuses them)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _vendored() -> list[Path]:
    return sorted([*CRDS.glob("*.yaml"), *CRDS.glob("*.yaml.gz")])


def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the served version's schema, for every vendored CRD."""
    schemas = {}
    for path in _vendored():
        data = path.read_bytes()
        text = (gzip.decompress(data) if path.suffix == ".gz" else data).decode()
        for crd in yaml.safe_load_all(text):
            if not crd:
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if version["served"]:
                    schema = _strict(version["schema"]["openAPIV3Schema"])
                    schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


SCHEMAS = _crd_schemas()


def validate(obj: Obj) -> None:
    """A CRD kind against its vendored schema; any other against Kubernetes' own."""
    schema = SCHEMAS.get((obj["apiVersion"], obj["kind"]))
    if schema is None:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    else:
        jsonschema.validate(obj, schema, cls=jsonschema.Draft7Validator)


@pytest.fixture(scope="module")
def rendered() -> list[Obj]:
    return kustomize(OVERLAY)


def test_the_crds_are_the_api_versions_used(rendered: list[Obj]) -> None:
    kinds = {(o["apiVersion"], o["kind"]) for o in rendered}
    custom = {
        ("gateway.networking.k8s.io/v1", "Gateway"),
        ("gateway.networking.k8s.io/v1", "HTTPRoute"),
        ("inference.networking.k8s.io/v1", "InferencePool"),
        ("gateway.envoyproxy.io/v1alpha1", "EnvoyExtensionPolicy"),
        ("gateway.envoyproxy.io/v1alpha1", "EnvoyProxy"),
    }
    assert custom <= kinds and custom <= set(SCHEMAS)
    builtin = {"v1", "apps/v1", "networking.k8s.io/v1"}
    assert {k for k in kinds if k not in custom} == {(v, k) for v, k in kinds if v in builtin}, (
        "a kind neither built in nor with a vendored CRD"
    )


def check_every_object_validates(rendered: list[Obj]) -> None:
    for obj in rendered:
        validate(obj)
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "specroute"
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "specroute"


def test_every_object_validates(rendered: list[Obj]) -> None:
    check_every_object_validates(rendered)


@pytest.mark.parametrize(
    ("kind", "edit"),
    [
        ("HTTPRoute", lambda o: o["spec"]["rules"][0].update(backendRef=[])),  # not a field
        ("InferencePool", lambda o: o["spec"]["targetPorts"][0].update(number="8000")),
        ("InferencePool", lambda o: o["spec"].pop("selector")),  # required
        ("EnvoyExtensionPolicy", lambda o: o["spec"]["extProc"][0].update(failopen=True)),
        ("EnvoyExtensionPolicy",
         lambda o: o["spec"]["extProc"][0]["processingMode"]["request"].update(body="BUFFERED")),
        ("Gateway", lambda o: o["spec"]["listeners"][0].update(protocol="HTTP", port=0)),
        ("Gateway", lambda o: o["spec"]["infrastructure"]["parametersRef"].pop("kind")),
        ("EnvoyProxy", lambda o: o["spec"]["bootstrap"].update(type="JsonPatch")),
        ("EnvoyProxy", lambda o: o["spec"]["bootstrap"]["jsonPatches"][0].update(op="set")),
        ("EnvoyProxy", lambda o: o["spec"]["bootstrap"].update(jsonPatch=[])),  # not a field
    ],
)  # fmt: skip
def test_a_wrong_field_fails_validation(rendered: list[Obj], kind: str, edit: Any) -> None:
    bad = copy.deepcopy(next(o for o in rendered if o["kind"] == kind))
    edit(bad)
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)


def test_without_the_standalone_gateway(rendered: list[Obj]) -> None:
    names = {(o["kind"], o["metadata"]["name"]) for o in rendered}
    for kind in ("Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"):
        assert (kind, "specroute-gateway") not in names
    assert {n for k, n in names if k == "Deployment"} == {
        "specroute-picker", "vllm-speculative", "vllm-baseline",
    }  # fmt: skip


def _picker_args(dep: Obj) -> argparse.Namespace:
    args = container(dep)["args"]
    assert args[0] == "ext-proc"
    parser = argparse.ArgumentParser(prog="specroute ext-proc")
    _add_ext_proc_arguments(parser)
    parsed = parser.parse_args(args[1:])  # an unknown flag exits: the test fails
    parsed.command = "ext-proc"
    apply_environment(parsed)  # ports checked and made numbers, as the CLI does
    return parsed


def test_the_picker(rendered: list[Obj]) -> None:
    dep = one(rendered, "Deployment", "specroute-picker")
    c = container(dep)
    args = _picker_args(dep)
    assert args.mode == "pool"  # the header the HTTPRoute matches
    spec = dep["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mount = next(m for m in c["volumeMounts"] if "configMap" in volumes[m["name"]])
    assert Path(args.config).parent == Path(mount["mountPath"])
    cm = one(rendered, "ConfigMap", "specroute-config-")
    assert volumes[mount["name"]]["configMap"]["name"] == cm["metadata"]["name"]
    source = K8S / "gateway" / Path(args.config).name
    assert cm["data"][Path(args.config).name] == source.read_text()
    config = load_config(source)
    assert config.server.host == "0.0.0.0" and args.host is None
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": args.port, "metrics": args.metrics_port}
    # Ready: the gRPC health service the picker serves, on its gRPC port.
    assert c["readinessProbe"]["grpc"] == {"port": args.port, "service": SERVICE}
    routes = {(r.method, r.resource.canonical) for r in create_app(config, forward=False).router.routes() if r.resource}  # fmt: skip
    for probe in ("startupProbe", "livenessProbe"):
        http = c[probe]["httpGet"]
        assert ("GET", http["path"]) in routes and http["port"] == "metrics"
    env = {e["name"]: e for e in c["env"]}
    for backend in config.routes.values():
        ref = env[backend.api_key_env]["valueFrom"]["secretKeyRef"]
        assert ref["key"] in one(rendered, "Secret", ref["name"])["stringData"]
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert spec["terminationGracePeriodSeconds"] > pre_stop + config.server.drain_s
    svc = one(rendered, "Service", "specroute-picker")
    assert selects(svc["spec"]["selector"], pod_labels(dep))
    for o in rendered:
        if o["kind"] == "Deployment" and o is not dep:
            assert not selects(svc["spec"]["selector"], pod_labels(o))
    by_name = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports[by_name["grpc"]["targetPort"]] == args.port
    assert by_name["grpc"]["appProtocol"] == "kubernetes.io/h2c"  # gRPC: HTTP/2


def _pool_of(rule: Obj) -> str:
    (ref,) = rule["backendRefs"]
    assert (ref["group"], ref["kind"]) == POOL
    return str(ref["name"])


def check_header_rules(rendered: list[Obj], routes: set[str], default: str) -> None:
    """The HTTPRoute matches the picker's header for each route to that route's pool, whose
    selector picks that route's vLLM Deployment (vllm-ROUTE) only, on its port; requests
    without the header go to the default route's pool."""
    route = one(rendered, "HTTPRoute", "specroute")
    gateway = one(rendered, "Gateway", "specroute")
    (parent,) = route["spec"]["parentRefs"]
    assert parent["name"] == gateway["metadata"]["name"]
    assert parent["sectionName"] in {li["name"] for li in gateway["spec"]["listeners"]}
    header_rules: dict[str, str] = {}
    fallback = []
    for rule in route["spec"]["rules"]:
        (match,) = rule["matches"]
        if "headers" in match:
            (header,) = match["headers"]
            assert header["name"] == ROUTE_HEADER and header.get("type", "Exact") == "Exact"
            assert "path" not in match
            header_rules[header["value"]] = _pool_of(rule)
        else:
            assert match["path"] == {"type": "PathPrefix", "value": "/"}
            fallback.append(_pool_of(rule))
    assert set(header_rules) == routes
    assert fallback == [header_rules[default]]  # no header, or the picker down
    pools = {
        o["metadata"]["name"]
        for o in rendered
        if (o["apiVersion"].split("/")[0], o["kind"]) == POOL
    }
    assert pools == set(header_rules.values())  # no pool left over (the pair's, say)
    for value, pool_name in header_rules.items():
        pool = one(rendered, "InferencePool", pool_name)
        vllm = one(rendered, "Deployment", f"vllm-{value}")
        matching = [
            o["metadata"]["name"]
            for o in rendered
            if o["kind"] == "Deployment"
            and selects(pool["spec"]["selector"]["matchLabels"], pod_labels(o))
        ]
        assert matching == [vllm["metadata"]["name"]]
        flags = dict(a[2:].split("=", 1) for a in container(vllm)["args"] if "=" in a)
        assert pool["spec"]["targetPorts"] == [{"number": int(flags["port"])}]
        assert "endpointPickerRef" not in pool["spec"]  # one server per pool


def test_the_route_matches_the_pickers_header_to_each_pool(rendered: list[Obj]) -> None:
    check_header_rules(rendered, {r.value for r in PAIR}, "baseline")


def test_the_extension_policy_calls_the_picker_as_the_bootstrap_does(
    rendered: list[Obj],
) -> None:
    policy = one(rendered, "EnvoyExtensionPolicy", "specroute-picker")
    (target,) = policy["spec"]["targetRefs"]
    assert (target["group"], target["kind"]) == ("gateway.networking.k8s.io", "HTTPRoute")
    one(rendered, "HTTPRoute", target["name"])
    (ext,) = policy["spec"]["extProc"]
    (ref,) = ext["backendRefs"]
    svc = one(rendered, "Service", ref["name"])
    assert ref["port"] in {p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc"}
    assert ext["backendSettings"]["healthCheck"]["active"] == {
        "type": "GRPC", "grpc": {"service": SERVICE}, "interval": "1s", "timeout": "1s",
        "unhealthyThreshold": 2, "healthyThreshold": 1,
    }  # fmt: skip
    # What deploy/envoy/envoy.yaml says, in Envoy Gateway's words.
    bootstrap = yaml.safe_load(POOL_BOOTSTRAP.read_text())
    http = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    (ext_proc,) = [f for f in http["typed_config"]["http_filters"] if "ext_proc" in f["name"]]
    envoy = ext_proc["typed_config"]
    words = {"BUFFERED": "Buffered", "STREAMED": "Streamed"}
    mode = ext["processingMode"]
    assert mode["request"]["body"] == words[envoy["processing_mode"]["request_body_mode"]]
    assert mode["response"]["body"] == words[envoy["processing_mode"]["response_body_mode"]]
    assert mode["response"]["attributes"] == envoy["response_attributes"]
    assert ext["failOpen"] is envoy["failure_mode_allow"] is True
    assert ext["messageTimeout"] == envoy["message_timeout"]


def check_vllm_admits_the_picker_and_envoy_gateways_proxies(
    rendered: list[Obj], server: str
) -> None:
    picker = one(rendered, "Deployment", "specroute-picker")
    vllm = one(rendered, "Deployment", server)
    policies = [o for o in rendered if o["kind"] == "NetworkPolicy"
                and selects(o["spec"]["podSelector"]["matchLabels"], pod_labels(vllm))]  # fmt: skip
    sources = [s for p in policies for rule in p["spec"]["ingress"] for s in rule["from"]]
    assert any(
        "podSelector" in s and selects(s["podSelector"]["matchLabels"], pod_labels(picker))
        for s in sources
    )
    namespaces = [
        s["namespaceSelector"]["matchLabels"] for s in sources if "namespaceSelector" in s
    ]
    assert {"kubernetes.io/metadata.name": "envoy-gateway-system"} in namespaces


@pytest.mark.parametrize("server", ["vllm-speculative", "vllm-baseline"])
def test_vllm_admits_the_picker_and_envoy_gateways_proxies(
    rendered: list[Obj], server: str
) -> None:
    check_vllm_admits_the_picker_and_envoy_gateways_proxies(rendered, server)


def test_the_vendored_files_say_where_they_come_from() -> None:
    for folder, paths in ((CRDS, _vendored()), (EG, sorted(EG.glob("*.yaml")))):
        readme = (folder / "README.md").read_text()
        assert paths
        for path in paths:
            assert f"`{path.name}`" in readme
    assert json.dumps(sorted(SCHEMAS))  # every served version was read


# ---- the Gateway's Envoy: Envoy Gateway's bootstrap, with the shipped runtime flags ----

EG = Path(__file__).resolve().parent / "envoy_gateway"  # its default bootstrap, vendored


def _pointer(path: str) -> list[str]:
    """An RFC 6901 JSON pointer's reference tokens."""
    assert path.startswith("/"), path
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _patched(document: Any, patches: list[Obj]) -> Any:
    """RFC 6902 `add`s applied in order, as Envoy Gateway applies `type: JSONPatch`
    (internal/xds/bootstrap/util.go; its own test case below gives the same). Any
    other op fails: the shipped patches only add."""
    out = copy.deepcopy(document)
    for patch in patches:
        assert patch["op"] == "add" and set(patch) == {"op", "path", "value"}, patch
        *parents, last = _pointer(patch["path"])
        node = out
        for token in parents:
            node = node[int(token)] if isinstance(node, list) else node[token]
        if isinstance(node, list):
            node.insert(len(node) if last == "-" else int(last), patch["value"])
        else:
            node[last] = patch["value"]
    return out


def _shipped_runtime() -> dict[str, Any]:
    """The static runtime layer of deploy/envoy's bootstraps (both carry the same)."""
    layers = [
        yaml.safe_load(path.read_text())["layered_runtime"]["layers"]
        for path in (POOL_BOOTSTRAP, POOL_BOOTSTRAP.with_name("envoy-endpoint.yaml"))
    ]
    assert layers[0] == layers[1] and len(layers[0]) == 1
    static: dict[str, Any] = layers[0][0]["static_layer"]
    return static


def _gateway_bootstrap(rendered: list[Obj]) -> Any:
    """Envoy Gateway's default bootstrap with the EnvoyProxy's patches applied."""
    proxy = one(rendered, "EnvoyProxy", "specroute-proxy")
    bootstrap = proxy["spec"]["bootstrap"]
    assert bootstrap["type"] == "JSONPatch" and "value" not in bootstrap
    return _patched(yaml.safe_load((EG / "bootstrap.yaml").read_text()), bootstrap["jsonPatches"])


def test_the_patching_is_envoy_gateways() -> None:
    base = yaml.safe_load((EG / "bootstrap.yaml").read_text())
    patches = yaml.safe_load((EG / "patch-global-config.in.yaml").read_text())
    assert _patched(base, patches) == yaml.safe_load(
        (EG / "patch-global-config.out.yaml").read_text()
    )


def test_the_gateways_envoy_gets_the_shipped_runtime_flags(rendered: list[Obj]) -> None:
    gateway = one(rendered, "Gateway", "specroute")
    proxy = one(rendered, "EnvoyProxy", "specroute-proxy")
    # Honoured in the Gateway's own namespace (Envoy Gateway v1.9.0,
    # internal/gatewayapi/contexts.go): the same one here.
    assert gateway["spec"]["infrastructure"]["parametersRef"] == {
        "group": "gateway.envoyproxy.io", "kind": "EnvoyProxy",
        "name": proxy["metadata"]["name"],
    }  # fmt: skip
    assert gateway["metadata"]["namespace"] == proxy["metadata"]["namespace"]
    base = yaml.safe_load((EG / "bootstrap.yaml").read_text())
    patched = _gateway_bootstrap(rendered)
    (layer,) = patched["layered_runtime"]["layers"]
    assert layer["name"] == "global_config"
    (before,) = base["layered_runtime"]["layers"]
    assert layer["static_layer"] == {**before["static_layer"], **_shipped_runtime()}
    patched["layered_runtime"] = base["layered_runtime"]
    assert patched == base  # nothing else changed


def _runnable_here(bootstrap: Any, tmp: Path) -> Path:
    """Envoy Gateway's bootstrap on this machine, written to a file: its ports
    ephemeral, its xDS server (absent) on a closed local port, its certificate files
    empty secret lists."""
    text = json.dumps(bootstrap)
    for port in (19000, 19001):
        text = text.replace(f'"port_value": {port}', '"port_value": 0')
    text = text.replace('"address": "envoy-gateway"', '"address": "127.0.0.1"')
    for name in ("xds-certificate.json", "xds-trusted-ca.json"):
        (tmp / name).write_text('{"resources": []}')
        text = text.replace(f'"/sds/{name}"', json.dumps(str(tmp / name)))
    assert "/sds/" not in text and "19000" not in text
    config = tmp / "bootstrap.json"
    config.write_text(text)
    return config


async def test_a_real_envoy_on_the_patched_bootstrap_has_the_flag_on(
    rendered: list[Obj], tmp_path: Path
) -> None:
    config = _runnable_here(_gateway_bootstrap(rendered), tmp_path)
    # It waits for an xDS server that never answers, so its admin is as far as it
    # gets: the runtime flags are read at start.
    node = ("--service-node", "specroute-test", "--service-cluster", "specroute")
    async with (
        envoy_admin(config, tmp_path, *node) as (_, admin),
        aiohttp.ClientSession() as session,
        session.get(f"{admin}/runtime") as resp,
    ):
        runtime = await resp.json()
    for key, value in _shipped_runtime().items():
        entry = runtime["entries"][key]
        assert entry["final_value"] == json.dumps(value), entry  # Envoy shows 'true'
        assert entry["layer_values"] == [entry["final_value"]]  # from the one layer
    assert runtime["layers"] == ["global_config"]
