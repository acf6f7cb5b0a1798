"""The shipped alert rules and dashboard are real: ``promtool check rules``
and ``promtool test rules`` (Debian package ``prometheus``) pass, every alert
has a firing unit test, and every series they read is one the server exports.

Without ``promtool`` this module skips locally and fails under ``CI=true``:
CI installs the package, so a missing binary there is a broken CI image.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import vllm_omni.errors.metrics  # noqa: F401 - registers the series below
from tests.observability.names import (
    DOCS,
    ENGINE_PREFIX,
    RULE_TESTS,
    RULES,
    dashboard_series,
    exported_series,
    rule_series,
    rules,
)
from tests.prom import local_text

EXPECTED_ALERTS = {
    "VllmOmniEngineDead",
    "VllmOmniStageFaulted",
    "VllmOmniEngineStalled",
    "VllmOmniHigh5xxRatio",
    "VllmOmniStageTimeouts",
    "VllmOmniOverloaded",
    "VllmOmniLegacyFallbacks",
    "VllmOmniEventLoopLag",
}
# prometheus-fastapi-instrumentator's counter (the server mounts it).
INSTRUMENTATOR_SERIES = {"http_requests_total"}
# Where vLLM's stat logger defines the engine's families (installed build).
_UPSTREAM_METRICS = (
    "v1/metrics/loggers.py",
    "v1/metrics/perf.py",
    "v1/spec_decode/metrics.py",
)
_DEFINITION_RE = re.compile(
    r'_(counter|gauge|histogram)_cls\(\s*name="(vllm:[a-z0-9_]+)"'
)


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


def _exported_series() -> set[str]:
    """Series names in this process's exposition text, children or not."""
    return exported_series(local_text()) | INSTRUMENTATOR_SERIES


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
    assert set(rules()) == EXPECTED_ALERTS
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    assert firing == EXPECTED_ALERTS
    assert quiet == EXPECTED_ALERTS


def test_rules_and_dashboard_read_only_exported_series() -> None:
    """Every series but the engines' is exported by this process already;
    the engines' (a vllm stage's) are checked on a live server with one
    (tests/real_engine) and here against the names upstream defines."""
    exported = _exported_series()
    for name in (
        "vllm_omni:engine_dead",
        "vllm_omni:requests_in_flight",
        "vllm_omni:aborts_total",
        "vllm_omni:admission_rejections_total",
    ):
        assert name in exported
    used = rule_series() | dashboard_series()
    engine = {name for name in used if name.startswith(ENGINE_PREFIX)}
    assert engine  # the engine row and alert
    assert used - engine <= exported, used - engine - exported
    assert engine <= _upstream_engine_series(), engine - _upstream_engine_series()
    # The dashboard shows everything the alerts watch.
    assert rule_series() <= dashboard_series()


def _upstream_engine_series() -> set[str]:
    """The series names of every family vLLM's stat logger defines: its
    ``name="vllm:..."`` literals, read from the installed source (building
    the logger needs a model; importing it, seconds), with a counter's
    ``_total`` and a histogram's ``_bucket``, ``_sum`` and ``_count``."""
    spec = importlib.util.find_spec("vllm")  # finds, does not import
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent
    names: set[str] = set()
    for module in _UPSTREAM_METRICS:
        text = (root / module).read_text(encoding="utf-8")
        for kind, name in _DEFINITION_RE.findall(text):
            if kind == "counter":
                name = name.removesuffix("_total")
                names.add(f"{name}_total")
            elif kind == "histogram":
                names.update(f"{name}_{part}" for part in ("bucket", "sum", "count"))
            names.add(name)
    return names
