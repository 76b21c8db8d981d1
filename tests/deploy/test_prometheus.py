"""deploy/prometheus: promtool checks the scrape configs and the alert rules,
and runs the rules' unit tests (deploy/prometheus/tests/); every alert has a
runbook_url whose section exists in docs/runbook.md."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, run
from tests.support import require_tool

PROM = DEPLOY / "prometheus"
HOW = "scripts/test.sh apt-installs Debian's prometheus, which ships promtool"


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_tool("promtool", HOW)


def test_check_rules(promtool: str) -> None:
    rules = sorted((PROM / "rules").glob("*.yml"))
    assert rules
    res = run([promtool, "check", "rules", *map(str, rules)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 13 rules found" in res.stdout


def test_rule_unit_tests(promtool: str) -> None:
    tests = sorted((PROM / "tests").glob("*.test.yml"))
    assert tests
    res = run([promtool, "test", "rules", *map(str, tests)], timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_every_alert_has_a_unit_test() -> None:
    alerts = {
        r["alert"]
        for path in (PROM / "rules").glob("*.yml")
        for g in yaml.safe_load(path.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    tested = {
        case["alertname"]
        for path in (PROM / "tests").glob("*.test.yml")
        for t in yaml.safe_load(path.read_text())["tests"]
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts <= tested, sorted(alerts - tested)
    for path in (PROM / "rules").glob("*.yml"):
        for g in yaml.safe_load(path.read_text())["groups"]:
            for r in g["rules"]:
                assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
                assert r["annotations"]["summary"] and r["annotations"]["description"]


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus-routes.yml"])
def test_check_config_compose(promtool: str, name: str) -> None:
    res = run([promtool, "check", "config", str(PROM / name)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 1 rule files found" in res.stdout


def test_check_config_kubernetes(promtool: str, tmp_path: Path) -> None:
    """Debian's promtool is built without Kubernetes service discovery, so the
    kubernetes_sd_configs blocks become static targets; everything else (the
    relabelling, its regexes, the rule files) is checked as written.
    test_k8s.py checks the discovery against the pods' labels."""
    config: dict[str, Any] = yaml.safe_load((PROM / "prometheus-kubernetes.yml").read_text())
    for job in config["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs")[0]["role"] == "pod"
        job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
    config["rule_files"] = [str(PROM / f) for f in config["rule_files"]]
    path = tmp_path / "prometheus-kubernetes.yml"
    path.write_text(yaml.safe_dump(config))
    res = run([promtool, "check", "config", str(path)])
    assert res.returncode == 0, res.stdout + res.stderr


RUNBOOK = DEPLOY.parent / "docs" / "runbook.md"


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (lower case, spaces to -)."""
    return {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#{1,6} (.+)$", markdown, flags=re.M)
    }


def test_every_alert_has_its_runbook_section() -> None:
    anchors = _anchors(RUNBOOK.read_text())
    alerts = [
        r
        for path in (PROM / "rules").glob("*.yml")
        for g in yaml.safe_load(path.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    ]
    assert len(alerts) == 13
    for rule in alerts:
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == "docs/runbook.md", url
        assert anchor == rule["alert"].lower() and anchor in anchors, url
    # Every section is an alert's: no runbook for an alert that no longer exists.
    sections = re.findall(r"^## (\w+)$", RUNBOOK.read_text(), flags=re.M)
    assert sorted(sections) == sorted(r["alert"] for r in alerts)
