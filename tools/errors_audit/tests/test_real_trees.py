"""The inventory on the published vllm-omni 0.30.0 wheel is pinned.

``fixtures/wheel-0.30.0-inventory.json`` holds the raise sites by
exception and top-level folder that the audit reported on the wheel before
issue 16 (which an independent ``ast.walk`` census matched), with variables
folded into one row; the prefilter, the walker and the rule fixes must not
move one. The wheel is downloaded once with pip (``benchmarks.bench_audit``).

Both real trees (the wheel and the installed vLLM 0.33) are also audited
twice, from skeletons and from whole parses, and must give the same sites;
and on every file of both, the C lexer's table of logical lines equals the
one from CPython's tokenizer.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from audit_testing import FIXTURES
from benchmarks.bench_audit import installed_vllm, wheel_tree
from vllm_omni_errors_audit import skeleton as skeleton_module
from vllm_omni_errors_audit.runner import Report, run_audit
from vllm_omni_errors_audit.scanner import (
    _HOT_STATEMENT,
    _TRIGGER_TOKENS,
    _skeleton_scanner,
)
from vllm_omni_errors_audit.skeleton import _lexer, _tokenized_lines, skeleton

PINNED = json.loads((FIXTURES / "wheel-0.30.0-inventory.json").read_text())


@pytest.fixture(scope="module")
def wheel() -> Path:
    try:
        return wheel_tree()
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"the vllm-omni 0.30.0 wheel cannot be downloaded here: {exc}")


def test_the_wheel_inventory_is_pinned(wheel: Path) -> None:
    report = run_audit([str(wheel)], jobs=2, cache=None)
    inventory = {name: dict(by_folder) for name, by_folder in report.inventory.items()}
    assert report.files == PINNED["files"] == 1609
    assert sum(map(sum, (c.values() for c in report.inventory.values()))) == 7571
    assert inventory == PINNED["inventory"]


def _sites(report: Report) -> list[tuple[str, str, int, int, str, str, str]]:
    return [
        (f.rule, f.path, f.line, f.column, f.fingerprint, f.message, f.suggestion)
        for f in report.findings
    ]


@pytest.fixture(scope="module", params=["vllm-omni 0.30.0", "vllm 0.33"])
def real_tree(request: pytest.FixtureRequest) -> Path:
    if request.param == "vllm 0.33":
        return installed_vllm()
    return request.getfixturevalue("wheel")


def test_the_skeleton_finds_what_the_whole_parse_finds(real_tree: Path) -> None:
    """Issue 16's speed work: every site (rule, file:line:col, fingerprint,
    message, suggestion) and every inventory count equal the whole parse's."""
    fast = run_audit([str(real_tree)], jobs=2, cache=None)
    whole = run_audit([str(real_tree)], jobs=2, cache=None, whole=True)
    assert fast.files == whole.files > 1500
    assert fast.inventory == whole.inventory
    assert _sites(fast) == _sites(whole)
    assert len(_sites(fast)) > 5000


def test_the_skeleton_is_used_for_nearly_every_file(wheel: Path) -> None:
    """So the comparison above compares two paths, not one path with itself:
    on the wheel, the skeleton is used for all but a handful of the files
    with something to audit, and drops most statements."""
    audited = fallbacks = kept = total = 0
    for path in sorted(wheel.rglob("*.py")):
        data = path.read_bytes()
        if _TRIGGER_TOKENS.search(data) is None:
            continue
        audited += 1
        fallbacks += _skeleton_scanner(data) is None
        text = data.decode()
        shape = skeleton(text, _HOT_STATEMENT)
        if shape is not None:
            kept += len(shape.source.split())
            total += len(text.split())
    assert audited > 900
    assert fallbacks <= 5
    assert kept < total / 3


def test_the_c_lexer_table_equals_the_tokenizers_on_every_file(
    real_tree: Path,
) -> None:
    compared = declined = 0
    mismatched: list[str] = []
    assert _lexer is not None, "the C lexer was not built"
    for path in sorted(real_tree.rglob("*.py")):
        try:
            text = path.read_bytes().decode()
        except UnicodeDecodeError:
            continue
        if "\r" in text or "\0" in text:
            continue  # the skeleton leaves these to the whole parse
        table = _lexer.logical_lines(text)
        if table is None:
            declined += 1
            continue
        compared += 1
        tokenized = _tokenized_lines(text)
        if tokenized is None or list(map(list, table[:6])) != list(
            map(list, tokenized[:6])
        ):
            mismatched.append(str(path.relative_to(real_tree)))
    assert mismatched == []
    assert compared > 1500
    # It declines no file of either tree (it would leave one to the
    # tokenizer: tabs in an indentation, a name outside ASCII).
    assert declined == 0


def test_the_c_runs_equal_the_python_runs_on_every_file(
    real_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``replaceable_runs`` in C against ``_replaceable_runs`` (its
    specification), on the statements and kept flags of every skeleton."""
    compared: list[bool] = []
    c_runs = skeleton_module._runs

    def both(statements: object, kept: list[bool]) -> list[tuple[int, int]]:
        runs = list(c_runs(statements, kept))  # type: ignore[arg-type]
        spec = list(skeleton_module._replaceable_runs(statements, kept))  # type: ignore[arg-type]
        compared.append(runs == spec)
        return runs

    monkeypatch.setattr(skeleton_module, "_runs", both)
    for path in sorted(real_tree.rglob("*.py")):
        data = path.read_bytes()
        if _TRIGGER_TOKENS.search(data) is None:
            continue
        try:
            skeleton(data.decode(), _HOT_STATEMENT)
        except UnicodeDecodeError:
            continue
    assert len(compared) > 900
    assert all(compared)
