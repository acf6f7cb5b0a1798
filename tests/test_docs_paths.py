"""What the documents point at is in the repository.

Every path of the repository that the README or a page under ``docs/`` names
exists (fenced blocks are left out: they show commands and output, often of
another tree such as the published 0.30.0 one), and so does every test the
CHANGELOG names as the one that pins a change (older source paths there are
history and may have moved). The design the code cites is ``docs/design.md``:
no file refers to a design document outside the repository, and every
section a reference to it or to ``docs/runtime.md`` cites exists.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_FOLDERS = ("vllm_omni", "tests", "docs", "benchmarks", "tools", "requirements")
PATH = re.compile(
    r"(?<![\w./-])((?:\.ci|" + "|".join(TOP_FOLDERS) + r")/[\w./-]*[\w/])"
)
SECTION = re.compile(r"(design|runtime)\.md\)?\s+§(\d+)(?:\.(\d+))?")


def _tracked() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def _named_paths(text: str) -> set[str]:
    """Paths named in the prose; fenced blocks show other trees' commands."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return {match.rstrip(".") for match in PATH.findall(prose)}


def _missing(paths: set[str]) -> list[str]:
    return sorted(p for p in paths if not (ROOT / p).exists() and "*" not in p)


@pytest.mark.parametrize(
    "document",
    ["README.md", *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("docs/**/*.md"))],
)
def test_every_path_a_document_names_exists(document: str) -> None:
    assert _missing(_named_paths((ROOT / document).read_text())) == []


def test_every_test_the_changelog_names_exists() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    tests = {p for p in _named_paths(text) if p.startswith("tests/")}
    assert len(tests) > 20
    assert _missing(tests) == []


def test_nothing_refers_to_a_design_document_outside_the_repository() -> None:
    sections = {
        (page, m.group(1), m.group(2))
        for page in ("design", "runtime")
        for m in re.finditer(
            r"^##+ §(\d+)(?:\.(\d+))?",
            (ROOT / "docs" / f"{page}.md").read_text(),
            re.MULTILINE,
        )
    }
    assert {("design", "1", None), ("design", "11", None)} <= sections
    assert {("runtime", "1", None), ("runtime", "14", None)} <= sections
    outside, dangling = [], []
    for path in _tracked():
        if path.suffix not in {".py", ".md", ".toml", ".yml", ".yaml", ""}:
            continue
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(errors="replace")
        name = path.relative_to(ROOT)
        for number, line in enumerate(text.splitlines(), 1):
            if re.search(r"DESIGN(\.md)?\b|shared/|shared folder", line):
                outside.append(f"{name}:{number}: {line.strip()}")
            for match in SECTION.finditer(line):
                if match.groups() not in sections:
                    dangling.append(f"{name}:{number}: {match.group(0)}")
    assert outside == []
    assert dangling == []
