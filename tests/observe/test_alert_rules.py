"""deploy/prometheus/gpuslice-rules.yml: valid for Prometheus (``promtool check rules``), each alert
fires on the series meant for it and not on the others (``promtool test rules``), and every gpuslice
metric it uses exists.

promtool comes with Debian's prometheus package; without it these tests skip, unless
GPUSLICE_REQUIRE_EXTERNAL is set (CI), where they fail."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "gpuslice-rules.yml"
RULE_TESTS = RULES.with_name("gpuslice-rules.test.yml")
SUFFIXES = ("_bucket", "_count", "_sum")


@pytest.fixture
def promtool(external_tool) -> str:
    return external_tool("promtool", "Debian: apt install prometheus")


def test_promtool_accepts_the_rules(promtool):
    result = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 18 rules found" in result.stdout


def test_each_alert_fires_on_its_case_and_not_on_the_others(promtool):
    result = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name], capture_output=True, text=True, cwd=RULES.parent
    )
    assert result.returncode == 0, result.stdout + result.stderr


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_every_alert_has_a_unit_test_where_it_fires_and_one_where_it_does_not():
    alerts = {r["alert"] for r in rules() if "alert" in r}
    checks = [
        t for case in yaml.safe_load(RULE_TESTS.read_text())["tests"] for t in case.get("alert_rule_test", [])
    ]
    assert alerts == {t["alertname"] for t in checks}
    assert alerts == {t["alertname"] for t in checks if t["exp_alerts"]}
    assert alerts == {t["alertname"] for t in checks if not t["exp_alerts"]}


def test_every_recording_rule_has_a_unit_test():
    recorded = {r["record"] for r in rules() if "record" in r}
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    tested = {t["expr"] for case in cases for t in case.get("promql_expr_test", [])}
    assert recorded and recorded <= tested


def test_the_rules_use_only_metrics_gpuslice_exports(exported_metrics):
    used = set(re.findall(r"\b(gpuslice_[a-z_]+)", RULES.read_text()))
    for name in used:
        base = next((name.removesuffix(s) for s in SUFFIXES if name.endswith(s)), name)
        assert name in exported_metrics or base in exported_metrics, f"{name} is not a gpuslice metric"
