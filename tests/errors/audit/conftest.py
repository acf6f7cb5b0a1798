"""Shared paths and helpers: the fixture tree, its annotations, the CLI.

The audit's expectations are written next to the audited code, as trailing
``# expect: RULE`` comments in ``tests/errors/audit_fixtures/tree``; the
helpers here read them back, so a test never restates a line number.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "errors" / "audit_fixtures"
TREE = FIXTURES / "tree"
TREE_ARG = TREE.relative_to(REPO).as_posix()
SARIF_SCHEMA = Path(__file__).with_name("sarif-schema-2.1.0.json")
_MARK = "# expect:"

Expected = set[tuple[str, int, str]]
RunCli = Callable[..., subprocess.CompletedProcess[str]]


def expected_findings(root: Path = TREE) -> Expected:
    """(path relative to the repo, line, rule) for every annotated line."""
    expected: Expected = set()
    for path in sorted(root.rglob("*.py")):
        shown = path.relative_to(REPO).as_posix()
        text = path.read_text(encoding="utf-8")
        for number, line in enumerate(text.splitlines(), start=1):
            if _MARK in line:
                rules = line.split(_MARK, 1)[1].split("#", 1)[0]
                expected |= {(shown, number, r.strip()) for r in rules.split(",")}
    return expected


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "vllm_omni.errors.audit", *args]


@pytest.fixture
def run_cli(tmp_path: Path) -> RunCli:
    """Run the audit in a subprocess from the repo root, with a private cache."""

    def run(
        *args: str, command: Sequence[str] | None = None, cwd: Path = REPO
    ) -> subprocess.CompletedProcess[str]:
        argv = [*(command or cli_command()), *args, "--cache-dir", str(tmp_path / "c")]
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)

    return run


@pytest.fixture
def audit_json(run_cli: RunCli) -> Callable[..., dict[str, object]]:
    def run(*args: str) -> dict[str, object]:
        done = run_cli(*args, "--format", "json")
        assert done.returncode in (0, 1), done.stderr
        return json.loads(done.stdout)

    return run
