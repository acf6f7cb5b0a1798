"""The partition table of docs/errors/stages.md names drills that exist.

Each row (cut shorter than the heartbeat timeout, heal, cut longer, a
flapping link, a cut mid-stream) names its test on each backend; every name
must be a test function of its file, so a renamed or removed drill fails
here instead of leaving the table pointing at nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "errors" / "stages.md"
SITUATIONS = ("cut shorter", "heal", "cut longer", "flapping link", "cut while")
_TEST = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _rows() -> list[list[str]]:
    section = DOC.read_text().split("## Stages on other hosts: partitions", 1)[1]
    section = section.split("\n## ", 1)[0]
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith("| ---")
    ][1:]


def _test_functions(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }


def test_every_situation_has_its_row() -> None:
    rows = _rows()
    assert len(rows) == len(SITUATIONS)
    for situation, row in zip(SITUATIONS, rows, strict=True):
        assert row[0].startswith(situation), row[0]


def test_every_row_names_existing_drills_on_both_backends() -> None:
    for row in _rows():
        named = _TEST.findall(row[-1])
        if row[0] == "heal":
            continue  # timed by the short-partition drills
        assert {path for path, _ in named} == {
            "tests/e2e/test_partitions.py",
            "tests/ray/test_ray_partitions.py",
        }, row[0]
        for path, name in named:
            assert name in _test_functions(path), f"{path}::{name}"
