"""The shipped alert rules and dashboard are real: ``promtool check rules``
and ``promtool test rules`` (Debian package ``prometheus``) pass, every alert
has a firing unit test, and every series they read is one the server exports.

Without ``promtool`` this module skips locally and fails under ``CI=true``:
CI installs the package, so a missing binary there is a broken CI image.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import vllm_omni.errors.metrics  # noqa: F401 - registers the series below
from tests.prom import local_text

DOCS = Path(__file__).resolve().parents[2] / "docs" / "observability"
RULES = DOCS / "alerts.yml"
RULE_TESTS = DOCS / "alerts.test.yml"
DASHBOARD = DOCS / "grafana-dashboard.json"
EXPECTED_ALERTS = {
    "VllmOmniEngineDead",
    "VllmOmniHigh5xxRatio",
    "VllmOmniStageTimeouts",
    "VllmOmniOverloaded",
    "VllmOmniLegacyFallbacks",
}
# prometheus-fastapi-instrumentator's counter (the server mounts it).
INSTRUMENTATOR_SERIES = {"http_requests_total"}
_SERIES_RE = re.compile(r"(vllm_omni:[a-z_]+|http_requests_total)")


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is not None:
        return found
    message = (
        "promtool not found: install Debian's 'prometheus' package "
        "(apt-get install -y prometheus)"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def _rules() -> dict[str, dict[str, object]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


def _exported_series() -> set[str]:
    """Series names in this process's exposition text, children or not."""
    names = {
        f"{family.name}_total" if family.type == "counter" else family.name
        for family in text_string_to_metric_families(local_text())
    }
    return names | INSTRUMENTATOR_SERIES


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = subprocess.run(
        [_promtool(), "test", "rules", RULE_TESTS.name],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=DOCS,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    assert set(_rules()) == EXPECTED_ALERTS
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    assert firing == EXPECTED_ALERTS
    assert quiet == EXPECTED_ALERTS


def test_rules_and_dashboard_read_only_exported_series() -> None:
    exported = _exported_series()
    for name in (
        "vllm_omni:engine_dead",
        "vllm_omni:requests_in_flight",
        "vllm_omni:aborts_total",
        "vllm_omni:admission_rejections_total",
    ):
        assert name in exported
    exprs = [str(rule["expr"]) for rule in _rules().values()]
    dashboard = json.loads(DASHBOARD.read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for expr in exprs for name in _SERIES_RE.findall(expr)}
    assert used <= exported, used - exported
    # The dashboard shows everything the alerts watch.
    rule_series = {
        name
        for rule in _rules().values()
        for name in _SERIES_RE.findall(str(rule["expr"]))
    }
    dashboard_series = {
        name
        for p in dashboard["panels"]
        for t in p["targets"]
        for name in _SERIES_RE.findall(t["expr"])
    }
    assert rule_series <= dashboard_series
