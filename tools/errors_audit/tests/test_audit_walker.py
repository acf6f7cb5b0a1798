"""Hostile trees: whatever the walker cannot audit is an OMNI000 finding.

Odd file names, unreadable folders, symlinked packages and cycles, FIFOs,
nesting past the recursion limit (in this process and in the worker pool),
and labels that must not depend on the order of the arguments.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from audit_testing import RunCli
from vllm_omni_errors_audit import runner

RAW = "def f():\n    raise ValueError('x')\n"


def write(path: Path, text: str = RAW) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def findings(run_cli: RunCli, *args: str) -> tuple[int, list[tuple[str, str, str]]]:
    done = run_cli(*args, "--format", "json")
    assert "Traceback" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    rows = [(f["path"], f["rule"], f["message"]) for f in report["findings"]]
    return done.returncode, rows


@pytest.mark.parametrize("fmt", ["text", "markdown", "sarif", "json"])
def test_an_undecodable_file_name_is_shown_escaped(
    tmp_path: Path, run_cli: RunCli, fmt: str
) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    (root / os.fsdecode(b"odd\xff.py")).write_text(RAW)
    done = run_cli(str(root), "--format", fmt)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    # SARIF: the real bytes, percent-encoded, so code scanning finds the file.
    expected = "odd%FF.py" if fmt == "sarif" else "odd\\\\xff.py"
    if fmt in ("text", "markdown"):
        expected = "odd\\xff.py"
    assert expected in done.stdout


def test_a_fifo_is_a_finding_not_a_hang(tmp_path: Path, run_cli: RunCli) -> None:
    root = tmp_path / "tree"
    write(root / "pkg" / "ok.py")
    os.mkfifo(root / "pkg" / "x.py")
    status, rows = findings(run_cli, str(root))
    assert status == 1
    assert sorted(rows)[1][1:] == ("OMNI000", "not a regular file")
    assert [row[1] for row in sorted(rows)] == ["OMNI001", "OMNI000"]


def test_a_broken_link_is_a_finding(tmp_path: Path, run_cli: RunCli) -> None:
    root = tmp_path / "tree"
    write(root / "ok.py")
    (root / "gone.py").symlink_to(tmp_path / "nowhere.py")
    _, rows = findings(run_cli, str(root))
    assert (str(root / "gone.py"), "OMNI000", "broken symbolic link") in rows


def test_a_symlinked_package_is_followed_once(tmp_path: Path, run_cli: RunCli) -> None:
    real = write(tmp_path / "real" / "pkg" / "mod.py").parent
    root = tmp_path / "tree"
    root.mkdir()
    (root / "pkg").symlink_to(real, target_is_directory=True)
    # A cycle back to the top, and a second link to the same package.
    (real / "loop").symlink_to(root, target_is_directory=True)
    (root / "again").symlink_to(real, target_is_directory=True)
    done = run_cli(str(root), "--format", "json")
    report = json.loads(done.stdout)
    assert done.returncode == 1
    assert report["files"] == 1
    assert [(f["folder"], f["rule"]) for f in report["findings"]] == [
        ("again", "OMNI001")
    ]


def test_an_unreadable_folder_is_a_finding(tmp_path: Path, run_cli: RunCli) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads a mode-000 folder; see the simulated test below")
    root = tmp_path / "tree"
    write(root / "ok.py")
    locked = root / "locked"
    write(locked / "hidden.py")
    locked.chmod(0)
    try:
        status, rows = findings(run_cli, str(locked))
    finally:
        locked.chmod(0o755)
    assert status == 1
    assert rows == [
        (str(locked), "OMNI000", "cannot read directory: Permission denied")
    ]


def test_an_unreadable_folder_is_a_finding_simulated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As root (CI here) no mode stops reading: the kernel's EACCES is
    # simulated at the one call that meets it.
    root = tmp_path / "tree"
    write(root / "ok.py")
    locked = write(root / "locked" / "hidden.py").parent
    real_scandir = os.scandir

    def scandir(path: str) -> object:
        if Path(path) == locked:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real_scandir(path)

    monkeypatch.setattr(runner.os, "scandir", scandir)
    for paths in ([str(locked)], [str(root)]):
        report = runner.run_audit(paths, jobs=1, cache=None, root=str(root))
        rows = [(f.relative, f.rule, f.message) for f in report.findings]
        assert ("locked", "OMNI000", "cannot read directory: Permission denied") in rows
    assert [f.relative for f in report.findings] == ["locked", "ok.py"]


def test_nesting_past_the_recursion_limit_is_a_finding_in_the_pool(
    tmp_path: Path, run_cli: RunCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "tree"
    for index in range(40):  # past _PARALLEL_MIN_FILES: the worker pool runs
        write(root / "pkg" / f"m{index:02}.py")
    write(root / "pkg" / "deep.py", "raise " + "a." * 1000 + "Error()\n")
    status, rows = findings(run_cli, str(root), "--jobs", "2")
    assert status == 1
    deep = [row for row in rows if row[0].endswith("deep.py")]
    assert [row[1] for row in deep] == ["OMNI000"]
    assert sum(row[1] == "OMNI001" for row in rows) == 40


def test_labels_do_not_depend_on_argument_order(
    tmp_path: Path, run_cli: RunCli
) -> None:
    root = tmp_path / "A"
    write(root / "entrypoints" / "serve.py")
    write(root / "engine" / "core.py")
    first = run_cli(str(root / "entrypoints"), str(root), "--format", "json")
    second = run_cli(str(root), str(root / "entrypoints"), "--format", "json")
    one, two = json.loads(first.stdout), json.loads(second.stdout)
    del one["roots"], two["roots"]
    assert one == two
    assert one["counts"] == {"OMNI001": {"engine": 1, "entrypoints": 1}}


def test_same_named_folders_of_several_roots_stay_apart(
    tmp_path: Path, run_cli: RunCli
) -> None:
    write(tmp_path / "A" / "x" / "m.py")
    write(tmp_path / "B" / "x" / "m.py")
    done = run_cli(
        str(tmp_path / "A" / "x"), str(tmp_path / "B" / "x"), "--format", "json"
    )
    assert json.loads(done.stdout)["counts"] == {"OMNI001": {"A": 1, "B": 1}}
    declared = run_cli(
        str(tmp_path / "A" / "x"), "--root", str(tmp_path / "A"), "--format", "json"
    )
    assert json.loads(declared.stdout)["counts"] == {"OMNI001": {"x": 1}}


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (("--root", "no/such/dir"), "is not a directory"),
        (("--root", "{sub}"), "is outside the project root"),
    ],
)
def test_a_bad_root_is_a_usage_error(
    tmp_path: Path, run_cli: RunCli, args: tuple[str, ...], complaint: str
) -> None:
    write(tmp_path / "sub" / "m.py")
    write(tmp_path / "other" / "m.py")
    argv = [arg.format(sub=tmp_path / "sub") for arg in args]
    done = run_cli(str(tmp_path / "other"), *argv)
    assert done.returncode == 2
    assert complaint in done.stderr
    assert "Traceback" not in done.stderr


def test_an_undecodable_root_argument_is_printable(
    tmp_path: Path, run_cli: RunCli
) -> None:
    # The Markdown header quotes the PATH arguments as given.
    root = tmp_path / os.fsdecode(b"dir\xfe")
    write(root / "m.py")
    done = run_cli(str(root), "--format", "markdown")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "dir\\xfe`: 1 findings" in done.stdout
