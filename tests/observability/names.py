"""The metric names the shipped dashboard and alert rules query, and the names
a ``/metrics`` text exports: shared by the checks of the main suite (this
process, the reference server) and of the real-engine suite (a live server
with a ``vllm`` stage)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

DOCS = Path(__file__).resolve().parents[2] / "docs" / "observability"
RULES = DOCS / "alerts.yml"
RULE_TESTS = DOCS / "alerts.test.yml"
DASHBOARD = DOCS / "grafana-dashboard.json"
# The engines' own families (a vllm stage's, with a stage label).
ENGINE_PREFIX = "vllm:"
_SERIES_RE = re.compile(r"(vllm_omni:[a-z0-9_]+|vllm:[a-z0-9_]+|http_requests_total)")


def rules() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


def dashboard_panels() -> list[dict[str, Any]]:
    """Every panel, row panels' children included."""
    panels: list[dict[str, Any]] = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def series_in(expressions: list[str]) -> set[str]:
    return {name for expr in expressions for name in _SERIES_RE.findall(expr)}


def rule_series() -> set[str]:
    return series_in([str(rule["expr"]) for rule in rules().values()])


def dashboard_series() -> set[str]:
    return series_in(
        [t["expr"] for p in dashboard_panels() for t in p.get("targets", [])]
    )


def queried_series() -> set[str]:
    """Every series name an alert rule or a dashboard panel reads."""
    return rule_series() | dashboard_series()


def exported_series(text: str) -> set[str]:
    """Series names in an exposition text: every sample's name, and for a
    family without samples (a labelled metric no event has touched yet) the
    names it will have (``_total`` for a counter)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        names.update(sample.name for sample in family.samples)
    return names
