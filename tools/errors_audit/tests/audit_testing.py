"""Shared paths and helpers of the audit's tests: the fixture tree, its
annotations, the command line.

The audit's expectations are written next to the audited code, as trailing
``# expect: RULE`` comments in ``fixtures/tree``; the helpers here read them
back, so a test never restates a line number. A plain module (the tests
folder is not a package: the repository's ``tests`` package is another), on
``sys.path`` beside the tests, as pytest puts it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().with_name("fixtures")
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
    return [sys.executable, "-m", "vllm_omni_errors_audit", *args]
