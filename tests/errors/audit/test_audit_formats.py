"""Output formats: SARIF against the official schema, the RFC's Markdown table."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest

from vllm_omni.errors.audit.rules import RULES

from .conftest import SARIF_SCHEMA, TREE, TREE_ARG, RunCli, expected_findings
from .test_audit_rules import census


@pytest.fixture(scope="module")
def sarif_validator() -> jsonschema.Draft4Validator:
    schema = json.loads(SARIF_SCHEMA.read_text())
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker())


def sarif(run_cli: RunCli, *args: str) -> dict:
    done = run_cli(TREE_ARG, "--format", "sarif", *args)
    assert done.returncode == 1, done.stderr
    return json.loads(done.stdout)


def test_sarif_validates_against_the_2_1_0_schema(
    run_cli: RunCli, sarif_validator: jsonschema.Draft4Validator, tmp_path: Path
) -> None:
    allow = tmp_path / "allow.toml"
    allow.write_text(
        f'[[allow]]\nrule = "OMNI004"\npath = "{TREE_ARG}/*"\nreason = "fixture"\n'
    )
    for args in ((), ("--allowlist", str(allow))):
        log = sarif(run_cli, *args)
        errors = sorted(sarif_validator.iter_errors(log), key=str)
        assert errors == []


def test_sarif_has_what_github_code_scanning_reads(run_cli: RunCli) -> None:
    (run,) = sarif(run_cli)["runs"]
    driver = run["tool"]["driver"]
    assert {"name", "version", "informationUri", "rules"} <= driver.keys()
    assert [rule["id"] for rule in driver["rules"]] == [rule.id for rule in RULES]
    for rule in driver["rules"]:
        assert {"shortDescription", "fullDescription", "help"} <= rule.keys()
        assert rule["defaultConfiguration"]["level"] in ("error", "warning", "note")
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"].endswith("/")
    found = set()
    for result in run["results"]:
        assert driver["rules"][result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["message"]["text"]
        (location,) = result["locations"]
        artifact = location["physicalLocation"]["artifactLocation"]
        region = location["physicalLocation"]["region"]
        assert artifact["uriBaseId"] == "%SRCROOT%"
        assert not artifact["uri"].startswith("/")
        assert region["startColumn"] >= 1
        assert len(result["partialFingerprints"]["omniSite/v1"]) == 20
        # Relative to the project root: the audited folder here.
        shown = f"{TREE_ARG}/{artifact['uri']}"
        found.add((shown, region["startLine"], result["ruleId"]))
    assert found == expected_findings()
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == TREE.as_uri() + "/"


def test_markdown_reproduces_the_inventory_table(run_cli: RunCli) -> None:
    text = run_cli(TREE_ARG, "--format", "markdown").stdout
    table = text.split("## Raise sites by exception\n\n", 1)[1].split("\n\n", 1)[0]
    header, _, *rows = [line.strip("|").split("|") for line in table.splitlines()]
    header = [cell.strip() for cell in header]
    assert header == [
        "exception",
        "kind",
        "(root)",
        "api/",
        "engine/",
        "vllm_omni/",
        "total",
    ]
    expected = census(TREE)
    assert len(rows) == len(expected)
    for row in rows:
        name, _, *counts, total = (cell.strip() for cell in row)
        by_folder = dict(zip(header[2:-1], counts, strict=True))
        census_row = expected[name.strip("`")]
        assert int(total) == sum(census_row.values())
        for heading, count in by_folder.items():
            folder = "." if heading == "(root)" else heading.rstrip("/")
            assert int(count or 0) == census_row[folder]
    assert "| `ValueError` | raw | 1 |  | 9 | 1 | 11 |" in table


def test_markdown_lists_findings_per_rule(run_cli: RunCli) -> None:
    text = run_cli(TREE_ARG, "--format", "markdown").stdout
    assert "| OMNI004 | status-range-guess |  |  |  | 10 |  | 10 |" in text
    assert "### OMNI002 broad-except-client-error (7)" in text


def test_json_counts_agree_with_findings(
    audit_json: Callable[..., dict[str, object]],
) -> None:
    report = audit_json(TREE_ARG)
    per_pair = Counter((f["rule"], f["folder"]) for f in report["findings"])
    flat = {
        (rule, folder): n
        for rule, by_folder in report["counts"].items()
        for folder, n in by_folder.items()
    }
    assert flat == dict(per_pair)
    assert report["inventory"]["VLLMValidationError"]["kind"] == "semantic"
    assert report["inventory"]["RuntimeError"]["kind"] == "builtin"
    assert report["files"] == 6
