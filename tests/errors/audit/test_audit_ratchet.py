"""The allowlist (a reason per entry) and the baseline (counts only fall)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import TREE_ARG, RunCli, expected_findings

ENGINE = f"{TREE_ARG}/engine/*"


def write_allowlist(tmp_path: Path, body: str) -> str:
    path = tmp_path / "allow.toml"
    path.write_text(body)
    return str(path)


def entry(rule: str, path: str, reason: str | None = "reviewed") -> str:
    lines = ["[[allow]]", f'rule = "{rule}"', f'path = "{path}"']
    if reason is not None:
        lines.append(f'reason = "{reason}"')
    return "\n".join(lines) + "\n"


def test_allowlisted_findings_leave_the_count(
    tmp_path: Path, audit_json: Callable[..., dict[str, object]]
) -> None:
    allow = write_allowlist(tmp_path, entry("OMNI001", ENGINE, "model-internal checks"))
    report = audit_json(TREE_ARG, "--allowlist", allow)
    engine_raw = {
        (path, line)
        for path, line, rule in expected_findings()
        if rule == "OMNI001" and "/engine/" in path
    }
    allowed = report["allowlisted"]
    assert {(f["path"], f["line"]) for f in allowed} == engine_raw
    assert {f["reason"] for f in allowed} == {"model-internal checks"}
    assert len(report["findings"]) == 48 - len(engine_raw)


def test_allowing_everything_exits_zero(tmp_path: Path, run_cli: RunCli) -> None:
    rules = ["OMNI000", "OMNI001", "OMNI002", "OMNI003", "OMNI004", "OMNI005"]
    body = "".join(entry(rule, f"{TREE_ARG}/*") for rule in rules)
    body += entry("OMNI002", "never/*.py")
    done = run_cli(TREE_ARG, "--allowlist", write_allowlist(tmp_path, body))
    assert done.returncode == 0
    assert "allowlist entry OMNI002 'never/*.py' matched nothing" in done.stderr


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        (entry("OMNI001", ENGINE, reason=None), "missing keys ['reason']"),
        (entry("OMNI001", ENGINE, reason="  "), "reason must not be empty"),
        (entry("OMNI999", ENGINE), "unknown rule 'OMNI999'"),
        (entry("OMNI001", ENGINE) + 'owner = "me"\n', "unknown keys ['owner']"),
        ('[allow]\nrule = "OMNI001"\n', "array of tables"),
        ("[[allow]\n", "not valid TOML"),
        ('[[allowed]]\nrule = "OMNI001"\n', "unknown top-level keys"),
    ],
)
def test_a_bad_allowlist_is_a_usage_error(
    tmp_path: Path, run_cli: RunCli, body: str, complaint: str
) -> None:
    done = run_cli(TREE_ARG, "--allowlist", write_allowlist(tmp_path, body))
    assert done.returncode == 2
    assert complaint in done.stderr


def test_baseline_ratchet(tmp_path: Path, run_cli: RunCli) -> None:
    tree = tmp_path / "tree"
    (tree / "api").mkdir(parents=True)
    module = tree / "api" / "routes.py"
    module.write_text("raise ValueError('a')\nraise ValueError('b')\n")
    baseline = tmp_path / "baseline.json"

    created = run_cli(str(tree), "--baseline", str(baseline), "--update-baseline")
    assert created.returncode == 0, created.stderr
    assert json.loads(baseline.read_text())["counts"] == {"OMNI001": {"api": 2}}

    # Findings within the baseline pass; without --baseline they fail.
    assert run_cli(str(tree), "--baseline", str(baseline)).returncode == 0
    assert run_cli(str(tree)).returncode == 1

    module.write_text("raise ValueError('a')\nraise ValueError('b')\nraise TypeError\n")
    grown = run_cli(str(tree), "--baseline", str(baseline))
    assert grown.returncode == 1
    assert "grew: OMNI001 in api: 2 -> 3 (+1)" in grown.stderr
    refused = run_cli(str(tree), "--baseline", str(baseline), "--update-baseline")
    assert refused.returncode == 1
    assert "refusing to raise counts" in refused.stderr
    assert json.loads(baseline.read_text())["counts"] == {"OMNI001": {"api": 2}}

    module.write_text("raise ValueError('a')\n")
    fallen = run_cli(str(tree), "--baseline", str(baseline))
    assert fallen.returncode == 0
    assert "fell: OMNI001 in api: 2 -> 1 (-1)" in fallen.stderr
    assert "--update-baseline" in fallen.stderr
    updated = run_cli(str(tree), "--baseline", str(baseline), "--update-baseline")
    assert updated.returncode == 0
    assert json.loads(baseline.read_text())["counts"] == {"OMNI001": {"api": 1}}

    # A new (rule, folder) pair is growth too.
    (tree / "core.py").write_text("import fastapi\nraise fastapi.HTTPException(404)\n")
    new_pair = run_cli(str(tree), "--baseline", str(baseline))
    assert new_pair.returncode == 1
    assert "grew: OMNI005 in .: 0 -> 1 (+1)" in new_pair.stderr


@pytest.mark.parametrize(
    ("content", "args", "complaint"),
    [
        (None, ("--baseline", "{b}"), "does not exist"),
        ("not json", ("--baseline", "{b}"), "not valid JSON"),
        ('{"counts": {"OMNI001": {"api": -1}}}', ("--baseline", "{b}"), "must be"),
        ('{"counts": {"X1": {}}}', ("--baseline", "{b}"), "must be"),
        (None, ("--update-baseline",), "needs --baseline"),
    ],
)
def test_a_bad_baseline_is_a_usage_error(
    tmp_path: Path,
    run_cli: RunCli,
    content: str | None,
    args: tuple[str, ...],
    complaint: str,
) -> None:
    baseline = tmp_path / "baseline.json"
    if content is not None:
        baseline.write_text(content)
    done = run_cli(TREE_ARG, *(arg.format(b=baseline) for arg in args))
    assert done.returncode == 2
    assert complaint in done.stderr
