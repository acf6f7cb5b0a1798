"""``--fix`` and ``--suggest`` on the published vllm-omni 0.30.0 tree.

A copy of the wheel's tree (downloaded once, as ``test_real_trees.py`` does)
is fixed in place through the command, twice over: as published, and after
the step ``--fix`` asks a person to take first (the five except clauses that
let ``HTTPException`` through but not the semantic types get ``VLLMError``
beside it; see ``docs/errors/migration.md``). Each time: every mechanical
finding is rewritten or left with a reason a person must judge; every
changed file parses and byte-compiles; ``ruff check --select F`` finds
nothing new; the re-audit has exactly the rewritten sites gone and no new
one; a second ``--fix`` changes nothing; and every line outside the
rewritten statements and the imports is byte for byte what it was.
``--suggest`` on ``entrypoints/`` writes a patch ``git apply`` accepts, and
applying it removes exactly the suggested sites.
"""

from __future__ import annotations

import ast
import difflib
import json
import py_compile
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.bench_audit import wheel_tree

PACKAGE = "vllm_omni"
# What a person must judge, by rule, on the 0.30.0 tree: a status with no
# semantic type (410), a status that is a variable, an error model handed
# to a caller that converts it, status guesses on values that are not
# records.
LEFT_ALWAYS = {
    ("OMNI005", "no semantic type has status 410"): 2,
    ("OMNI005", "its status is not a literal"): 4,
    (
        "OMNI003",
        "the error model goes to a caller that sets the status from it; "
        "raising instead changes what that caller catches",
    ): 23,
    ("OMNI003", "its error's code is not a literal status"): 1,
    ("OMNI004", "the status does not come from an OmniErrorDetails record"): 4,
}
# As published, three routes wrap their bodies in ``except HTTPException:
# raise`` before ``except Exception: ... 500``, and one helper cleans up in
# ``except (..., HTTPException, ...): raise``: there a semantic type would
# take another way (a 400 would become a 500). Raises inside those try
# blocks are left, and so is every HTTPException outside a route (any
# helper may be called inside one).
CAUGHT = "its try's except HTTPException catches one of HTTPException and {}, not both"
CATCHERS = (
    "raised outside a route, and vllm_omni/entrypoints/openai/api_server.py "
    "(generate_images: except HTTPException) and 4 more tell HTTPException from "
    "the semantic types: a caller may reach them; migrate those except clauses "
    "first"
)
LEFT_AS_PUBLISHED = {
    **LEFT_ALWAYS,
    ("OMNI005", CAUGHT.format("VLLMValidationError")): 5,
    ("OMNI005", CAUGHT.format("OmniServiceUnavailableError")): 3,
    ("OMNI005", CAUGHT.format("VLLMUnprocessableEntityError")): 1,
    ("OMNI005", CAUGHT.format("VLLMServerError")): 1,
    ("OMNI005", CATCHERS): 78,
}
# The person's step: the clauses above also let the semantic types through.
HANDLERS = {
    "entrypoints/openai/api_server.py": [
        ("    except HTTPException:\n", "    except (HTTPException, VLLMError):\n", 3),
        (
            "from vllm_omni.errors import OmniClientError\n",
            "from vllm_omni.errors import OmniClientError, VLLMError\n",
            1,
        ),
    ],
    "entrypoints/openai/video/generation/helpers.py": [
        ("    except HTTPException:\n", "    except (HTTPException, VLLMError):\n", 1),
        (
            "except (asyncio.CancelledError, HTTPException, OSError,",
            "except (asyncio.CancelledError, HTTPException, VLLMError, OSError,",
            1,
        ),
        (
            "\nfrom fastapi import ",
            "\nfrom vllm_omni.errors import VLLMError\nfrom fastapi import ",
            1,
        ),
    ],
}
SCENARIOS = {
    # scenario: (rewritten by rule, files changed, left)
    "as published": ({"OMNI005": 39, "OMNI003": 2}, 1, LEFT_AS_PUBLISHED),
    "handlers migrated": ({"OMNI005": 127, "OMNI003": 2}, 10, LEFT_ALWAYS),
}


@dataclass(frozen=True, slots=True)
class Fixed:
    scenario: str
    # The tree before --fix, and the fixed copy.
    original: Path
    root: Path
    before: dict[str, dict[str, object]]
    after: dict[str, dict[str, object]]
    summary: str
    left: Counter[tuple[str, str]]


def audit(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command from ``root``; ``-P`` keeps the tree's own ``vllm_omni``
    (the wheel's) off ``sys.path``."""
    return subprocess.run(
        [sys.executable, "-P", "-m", "vllm_omni.errors.audit", *args, "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )


def findings(root: Path, *paths: str) -> dict[str, dict[str, object]]:
    done = audit(root, *paths, "--format", "json")
    assert done.returncode == 1, done.stderr
    return {f["fingerprint"]: f for f in json.loads(done.stdout)["findings"]}


def copy(wheel: Path, root: Path) -> Path:
    shutil.copytree(wheel, root / PACKAGE)
    return root


@pytest.fixture(scope="module")
def wheel() -> Path:
    try:
        return wheel_tree()
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"the vllm-omni 0.30.0 wheel cannot be downloaded here: {exc}")


def migrate_handlers(root: Path) -> None:
    for relative, edits in HANDLERS.items():
        path = root / PACKAGE / relative
        text = path.read_text()
        for old, new, count in edits:
            assert text.count(old) == count, (relative, old)
            text = text.replace(old, new)
        path.write_text(text)


@pytest.fixture(scope="module", params=list(SCENARIOS))
def fixed(
    wheel: Path,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Fixed:
    original = copy(wheel, tmp_path_factory.mktemp("original"))
    if request.param == "handlers migrated":
        migrate_handlers(original)
    root = tmp_path_factory.mktemp("fixed")
    shutil.copytree(original / PACKAGE, root / PACKAGE)
    before = findings(root, PACKAGE)
    done = audit(root, PACKAGE, "--fix", "--format", "json")
    assert done.returncode == 1, done.stderr
    summary, *rows = done.stderr.splitlines()
    left = Counter(
        (row.split(" ")[3].rstrip(":"), row.split(": ", 2)[2])
        for row in rows
        if row.startswith("not fixed: ")
    )
    after = {f["fingerprint"]: f for f in json.loads(done.stdout)["findings"]}
    return Fixed(request.param, original, root, before, after, summary, left)


def changed_files(fixed: Fixed) -> list[Path]:
    return sorted(
        path.relative_to(fixed.root)
        for path in (fixed.root / PACKAGE).rglob("*.py")
        if path.read_bytes()
        != (fixed.original / path.relative_to(fixed.root)).read_bytes()
    )


def test_every_mechanical_finding_is_rewritten_or_left_with_its_reason(
    fixed: Fixed,
) -> None:
    rewritten, files, left = SCENARIOS[fixed.scenario]
    gone = Counter(
        fixed.before[f]["rule"] for f in set(fixed.before) - set(fixed.after)
    )
    assert gone == rewritten
    assert fixed.left == left
    assert fixed.summary == (
        f"vllm-omni errors audit: fixed {gone.total()} sites in {files} files; "
        f"{len(fixed.after)} findings remain; {sum(left.values())} left for a person"
    )
    # Every site of the three kinds is rewritten or listed with its reason.
    mechanical = Counter(
        f["rule"]
        for f in fixed.before.values()
        if f["rule"] in ("OMNI003", "OMNI004", "OMNI005")
    )
    assert mechanical == {"OMNI005": 133, "OMNI003": 26, "OMNI004": 4}
    assert gone.total() + fixed.left.total() == mechanical.total()


def test_the_reaudit_loses_exactly_the_rewritten_sites(fixed: Fixed) -> None:
    rewritten, _, _ = SCENARIOS[fixed.scenario]
    assert set(fixed.after) < set(fixed.before)
    assert len(fixed.before) - len(fixed.after) == sum(rewritten.values())
    # The command's report after --fix is what a fresh audit says.
    assert set(findings(fixed.root, PACKAGE)) == set(fixed.after)


def test_every_changed_file_parses_and_byte_compiles(
    fixed: Fixed, tmp_path: Path
) -> None:
    changed = changed_files(fixed)
    assert len(changed) == SCENARIOS[fixed.scenario][1]
    for relative in changed:
        source = fixed.root / relative
        ast.parse(source.read_bytes())
        py_compile.compile(str(source), cfile=str(tmp_path / "x.pyc"), doraise=True)


def _ruff_f(root: Path, files: list[Path]) -> Counter[tuple[str, str, str]]:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    done = subprocess.run(
        [
            ruff,
            "check",
            "--select",
            "F",
            "--isolated",
            "--no-cache",
            "--output-format",
            "json",
            *map(str, files),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr
    return Counter(
        (Path(d["filename"]).relative_to(root).as_posix(), d["code"], d["message"])
        for d in json.loads(done.stdout)
    )


def test_ruff_pyflakes_finds_nothing_new(fixed: Fixed) -> None:
    changed = changed_files(fixed)
    before = _ruff_f(fixed.original, changed)
    after = _ruff_f(fixed.root, changed)
    assert after - before == Counter()


def test_a_second_fix_changes_nothing(fixed: Fixed) -> None:
    snapshot = {p: p.read_bytes() for p in (fixed.root / PACKAGE).rglob("*.py")}
    done = audit(fixed.root, PACKAGE, "--fix")
    assert done.returncode == 1
    assert done.stderr.startswith("vllm-omni errors audit: fixed 0 sites in 0 files; ")
    assert {p: p.read_bytes() for p in snapshot} == snapshot


def _statement_lines(tree: ast.Module) -> list[tuple[int, int, bool]]:
    """(first, last, is import) of every statement, compound ones included."""
    return [
        (
            node.lineno,
            node.end_lineno or node.lineno,
            isinstance(node, ast.Import | ast.ImportFrom),
        )
        for node in ast.walk(tree)
        if isinstance(node, ast.stmt)
    ]


def test_every_unchanged_line_is_byte_identical(fixed: Fixed) -> None:
    """Old lines that differ are blank, in an import statement, or in the
    smallest statement holding a rewritten site; new lines appear only
    there or next to an import."""
    fixed_lines: dict[str, set[int]] = {}
    for fingerprint in set(fixed.before) - set(fixed.after):
        site = fixed.before[fingerprint]
        path = str(site["path"]).split(f"{PACKAGE}/", 1)[1]
        fixed_lines.setdefault(path, set()).add(int(site["line"]))
    for relative in changed_files(fixed):
        old = (fixed.original / relative).read_bytes()
        new = (fixed.root / relative).read_bytes()
        statements = _statement_lines(ast.parse(old))
        lines = fixed_lines[relative.relative_to(PACKAGE).as_posix()]
        allowed: set[int] = set()
        for first, last, is_import in statements:
            inner = [
                s
                for s in statements
                if s[0] >= first and s[1] <= last and s != (first, last, is_import)
            ]
            holds_site = any(first <= n <= last for n in lines)
            smallest = holds_site and not any(
                any(s[0] <= n <= s[1] for n in lines) for s in inner
            )
            if is_import or smallest:
                allowed.update(range(first, last + 1))
        old_lines = old.splitlines(keepends=True)
        matcher = difflib.SequenceMatcher(
            None, old_lines, new.splitlines(keepends=True), autojunk=False
        )
        for tag, i1, i2, _, _ in matcher.get_opcodes():
            if tag == "equal":
                continue
            for number in range(i1 + 1, i2 + 1):
                assert number in allowed or not old_lines[number - 1].strip(), (
                    relative,
                    number,
                )
            if tag == "insert":
                assert i1 in allowed or i1 + 1 in allowed, (relative, i1)


def test_suggest_on_entrypoints_is_a_patch_git_applies(
    wheel: Path, tmp_path: Path
) -> None:
    root = copy(wheel, tmp_path)
    entrypoints = f"{PACKAGE}/entrypoints"
    before = findings(root, entrypoints)
    done = audit(root, entrypoints, "--suggest")
    assert done.returncode == 1, done.stderr
    summary = done.stderr.splitlines()[0]
    suggested = int(summary.split("suggested ")[1].split(" ")[0])
    assert suggested > 0
    assert done.stdout.startswith(f"--- a/{entrypoints}/")
    # Nothing was written.
    assert findings(root, entrypoints) == before
    (root / "audit.patch").write_text(done.stdout)
    for options in (["--check"], []):
        applied = subprocess.run(
            ["git", "apply", *options, "audit.patch"],
            cwd=root,
            capture_output=True,
            text=True,
        )
        assert applied.returncode == 0, applied.stderr
    after = findings(root, entrypoints)
    assert set(after) < set(before)
    assert len(before) - len(after) == suggested
