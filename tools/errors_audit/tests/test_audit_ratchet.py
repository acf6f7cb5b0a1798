"""The allowlist (a reason per entry) and the baseline (counts only fall)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from audit_testing import TREE_ARG, RunCli, expected_findings

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


def _sites(baseline: Path) -> list[tuple[str, str, str]]:
    document = json.loads(baseline.read_text())
    assert document["version"] == 2
    return [(s["rule"], s["path"], s["scope"]) for s in document["sites"]]


@pytest.fixture
def routes(tmp_path: Path) -> Path:
    module = tmp_path / "tree" / "api" / "routes.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "def create(n):\n"
        "    if n < 0:\n"
        "        raise ValueError('n must be >= 0')\n"
        "    raise TypeError('bad n')\n"
    )
    return module


def test_a_baseline_holds_sites_not_counts(
    tmp_path: Path, run_cli: RunCli, routes: Path
) -> None:
    tree, baseline = str(routes.parents[1]), tmp_path / "baseline.json"
    created = run_cli(tree, "--baseline", str(baseline), "--update-baseline")
    assert created.returncode == 0, created.stderr
    assert _sites(baseline) == [
        ("OMNI001", "api/routes.py", "create"),
        ("OMNI001", "api/routes.py", "create"),
    ]
    # Findings within the baseline pass; without --baseline they fail.
    assert run_cli(tree, "--baseline", str(baseline)).returncode == 0
    assert run_cli(tree).returncode == 1


def test_line_moves_and_unrelated_edits_keep_a_site(
    tmp_path: Path, run_cli: RunCli, routes: Path
) -> None:
    tree, baseline = str(routes.parents[1]), tmp_path / "baseline.json"
    run_cli(tree, "--baseline", str(baseline), "--update-baseline")
    moved = "import os\n\n\n" + routes.read_text().replace(
        "raise TypeError('bad n')", "x = os.sep\n    raise  TypeError( 'bad n' )"
    )
    routes.write_text(moved)
    done = run_cli(tree, "--baseline", str(baseline))
    assert (done.returncode, done.stderr) == (0, "")


def test_fixing_one_site_and_adding_another_fails_naming_the_new_one(
    tmp_path: Path, run_cli: RunCli, routes: Path
) -> None:
    tree, baseline = str(routes.parents[1]), tmp_path / "baseline.json"
    run_cli(tree, "--baseline", str(baseline), "--update-baseline")
    # Same folder, same rule, same count: a count ratchet would pass.
    routes.write_text(
        routes.read_text().replace("raise TypeError('bad n')", "return n")
        + "\n\ndef delete(n):\n    raise ValueError('gone')\n"
    )
    done = run_cli(tree, "--baseline", str(baseline))
    assert done.returncode == 1
    first = done.stderr.splitlines()[0]
    assert first == (
        f"{routes}:8:5 OMNI001 raw ValueError raised ('gone'): its status depends "
        "on the fallback mode (legacy 4xx/501, strict 500)"
    )
    assert "1 new sites not in the baseline" in done.stderr
    refused = run_cli(tree, "--baseline", str(baseline), "--update-baseline")
    assert refused.returncode == 1
    assert "refusing to add sites" in refused.stderr
    assert len(_sites(baseline)) == 2


def test_fixed_sites_are_tightenable(
    tmp_path: Path, run_cli: RunCli, routes: Path
) -> None:
    tree, baseline = str(routes.parents[1]), tmp_path / "baseline.json"
    run_cli(tree, "--baseline", str(baseline), "--update-baseline")
    routes.write_text(routes.read_text().replace("raise TypeError('bad n')", "pass"))
    done = run_cli(tree, "--baseline", str(baseline))
    assert done.returncode == 0
    assert "tightenable: api/routes.py:4 OMNI001 in create is fixed" in done.stderr
    assert "--update-baseline" in done.stderr
    updated = run_cli(tree, "--baseline", str(baseline), "--update-baseline")
    assert updated.returncode == 0
    assert _sites(baseline) == [("OMNI001", "api/routes.py", "create")]


def test_identical_statements_in_one_scope_are_distinct_sites(
    tmp_path: Path, run_cli: RunCli, routes: Path
) -> None:
    tree, baseline = str(routes.parents[1]), tmp_path / "baseline.json"
    routes.write_text("def f():\n    raise ValueError('x')\n")
    run_cli(tree, "--baseline", str(baseline), "--update-baseline")
    routes.write_text(
        "def f():\n    raise ValueError('x')\n    raise ValueError('x')\n"
    )
    done = run_cli(tree, "--baseline", str(baseline))
    assert done.returncode == 1
    assert done.stderr.splitlines()[0].startswith(f"{routes}:3:5 OMNI001")


def test_a_count_baseline_is_read_and_converted(
    tmp_path: Path, run_cli: RunCli, routes: Path
) -> None:
    tree, baseline = str(routes.parents[1]), tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"version": 1, "counts": {"OMNI001": {"api": 2}}}))
    kept = run_cli(tree, "--baseline", str(baseline))
    assert kept.returncode == 0
    assert "holds counts; run with --update-baseline to convert" in kept.stderr

    routes.write_text(routes.read_text() + "raise OverflowError\n")
    grown = run_cli(tree, "--baseline", str(baseline))
    assert grown.returncode == 1
    assert "grew: OMNI001 in api: 2 -> 3 (+1)" in grown.stderr
    # Counts cannot say which site is new: each one of the group is named.
    assert f"{routes}:5:1 OMNI001 raw OverflowError raised" in grown.stderr

    routes.write_text(routes.read_text().replace("raise OverflowError\n", ""))
    converted = run_cli(tree, "--baseline", str(baseline), "--update-baseline")
    assert converted.returncode == 0
    assert "converted from counts to sites" in converted.stderr
    assert len(_sites(baseline)) == 2


@pytest.mark.parametrize(
    ("content", "args", "complaint"),
    [
        (None, ("--baseline", "{b}"), "does not exist"),
        ("not json", ("--baseline", "{b}"), "not valid JSON"),
        ('{"counts": {"OMNI001": {"api": -1}}}', ("--baseline", "{b}"), "must be"),
        ('{"counts": {"X1": {}}}', ("--baseline", "{b}"), "must be"),
        ('{"sites": [{"rule": "OMNI001"}]}', ("--baseline", "{b}"), "'sites' must"),
        ("[]", ("--baseline", "{b}"), "must be a JSON object"),
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


@pytest.mark.parametrize("where", ["missing-dir/b.json", "read-only/b.json"])
def test_an_unwritable_baseline_is_a_usage_error(
    tmp_path: Path, run_cli: RunCli, where: str
) -> None:
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if where.startswith("read-only") and os.access(read_only, os.W_OK):
        pytest.skip("running as root: a read-only mode does not stop writes")
    target = tmp_path / where
    done = run_cli(TREE_ARG, "--baseline", str(target), "--update-baseline")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert f"cannot write baseline {target}" in done.stderr
