"""Output formats: SARIF against the official schema, the RFC's Markdown table."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest

from audit_testing import SARIF_SCHEMA, TREE, TREE_ARG, RunCli, expected_findings
from test_audit_rules import EXPECTED_COUNTS as EXPECTED_BY_RULE
from test_audit_rules import census
from vllm_omni_errors_audit.formats import render_markdown
from vllm_omni_errors_audit.rules import RULES
from vllm_omni_errors_audit.runner import Report, ReportedFinding


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
    fingerprints = [f["fingerprint"] for f in report["findings"]]
    assert len(set(fingerprints)) == len(fingerprints) == 48
    scopes = {(f["path"].rsplit("/", 1)[1], f["scope"]) for f in report["findings"]}
    assert ("raw.py", "Base.wrong_type") in scopes


def test_sarif_keeps_at_most_max_results_errors_first(run_cli: RunCli) -> None:
    done = run_cli(TREE_ARG, "--format", "sarif", "--sarif-max-results", "10")
    (run,) = json.loads(done.stdout)["runs"]
    assert done.returncode == 1
    levels = [result["level"] for result in run["results"]]
    # 13 error-level findings (OMNI000 1, OMNI002 7, OMNI003 5): the first 10.
    assert levels == ["error"] * 10
    left_out = run["properties"]["resultsLeftOut"]
    assert sum(left_out.values()) == 48 - 10
    assert left_out["OMNI001"] == EXPECTED_BY_RULE["OMNI001"]
    assert "38 results over --sarif-max-results 10 left out" in done.stderr


def test_sarif_leaves_allowlisted_results_out_unless_asked(
    run_cli: RunCli, tmp_path: Path
) -> None:
    allow = tmp_path / "allow.toml"
    allow.write_text(
        f'[[allow]]\nrule = "OMNI004"\npath = "{TREE_ARG}/*"\nreason = "fixture"\n'
    )
    default = run_cli(TREE_ARG, "--format", "sarif", "--allowlist", str(allow))
    (run,) = json.loads(default.stdout)["runs"]
    assert {r["ruleId"] for r in run["results"]} == set(EXPECTED_BY_RULE) - {"OMNI004"}
    assert run["properties"]["allowlistedLeftOut"] == 10
    assert "10 allowlisted findings left out" in default.stderr
    kept = run_cli(
        TREE_ARG,
        "--format",
        "sarif",
        "--allowlist",
        str(allow),
        "--sarif-include-allowlisted",
    )
    (run,) = json.loads(kept.stdout)["runs"]
    suppressed = [r for r in run["results"] if "suppressions" in r]
    assert len(suppressed) == 10
    assert {r["ruleId"] for r in suppressed} == {"OMNI004"}
    assert run["properties"]["allowlistedLeftOut"] == 0


def test_markdown_numbers_have_one_format() -> None:
    findings = [
        ReportedFinding("OMNI001", f"m{i}.py", "big", 1, 1, "m", "s")
        for i in range(1_234)
    ]
    report = Report(
        roots=["x"],
        root="/x",
        files=2_500,
        folders=["big", "small"],
        inventory={"ValueError": Counter({"big": 4_921, "small": 7})},
        findings=findings,
    )
    text = render_markdown(report)
    assert "| `ValueError` | raw | 4,921 | 7 | 4,928 |" in text
    assert "| OMNI001 | raw-raise | 1,234 | 1,234 |" in text
    assert "2,500 files audited under `x`: 1,234 findings" in text
    assert "### OMNI001 raw-raise (1,234)" in text
