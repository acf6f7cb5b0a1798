"""The command, as users and CI run it: exit status, output, import cost."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from audit_testing import REPO, TREE_ARG, RunCli
from vllm_omni_errors_audit import cli, runner
from vllm_omni_errors_audit.rules import RULES

HEAVY_MODULES = ("vllm", "torch", "fastapi", "starlette", "pydantic", "numpy")


@pytest.fixture
def clean_tree(tmp_path: Path) -> Path:
    root = tmp_path / "clean"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text(
        "def f(x):\n    if x is None:\n        raise RuntimeError('invariant')\n"
    )
    return root


def console_script() -> list[str]:
    script = shutil.which("vllm-omni")
    if script is None:
        pytest.skip("the vllm-omni console script is not installed")
    return [script, "errors", "audit"]


@pytest.mark.parametrize("via", ["python -m", "console script"])
def test_exit_status(run_cli: RunCli, clean_tree: Path, via: str) -> None:
    command = console_script() if via == "console script" else None
    assert run_cli(str(clean_tree), command=command).returncode == 0
    assert run_cli(TREE_ARG, command=command).returncode == 1
    assert run_cli("no/such/path", command=command).returncode == 2
    assert run_cli(TREE_ARG, "--jobs", "0", command=command).returncode == 2
    assert run_cli(TREE_ARG, "--format", "xml", command=command).returncode == 2


def test_help_documents_the_exit_status(run_cli: RunCli) -> None:
    done = run_cli("--help")
    assert done.returncode == 0
    assert "exit status:" in done.stdout
    for code in ("0  clean", "1  findings", "2  usage or configuration", "3  internal"):
        assert code in done.stdout


def test_text_output_is_one_line_per_finding(run_cli: RunCli) -> None:
    done = run_cli(TREE_ARG)
    *lines, summary, inventory = done.stdout.splitlines()
    assert len(lines) == 48
    # Files by path, findings within a file by line.
    assert lines[0].startswith(
        f"{TREE_ARG}/api/routes.py:17:11: OMNI005 http-exception: HTTPException(404)"
    )
    assert lines[-1].startswith(f"{TREE_ARG}/vllm_omni/errors/owned.py:")
    positions = [line.split(": ", 1)[0].split(":") for line in lines]
    keyed = [(path, int(row), int(col)) for path, row, col in positions]
    assert keyed == sorted(keyed)
    assert summary.startswith("audited 6 files: 48 findings (OMNI000 1, OMNI001 18,")
    assert inventory.startswith("raise sites: ValueError 11,")


def test_output_file(run_cli: RunCli, tmp_path: Path) -> None:
    target = tmp_path / "audit.json"
    done = run_cli(TREE_ARG, "--format", "json", "--output", str(target))
    assert (done.returncode, done.stdout) == (1, "")
    assert len(json.loads(target.read_text())["findings"]) == 48


def test_the_audit_imports_nothing_heavy(clean_tree: Path, tmp_path: Path) -> None:
    # Through the real dispatcher, a full run, then look at sys.modules.
    probe = (
        "import sys\n"
        "from vllm_omni.entrypoints.cli.main import main\n"
        "rc = main(['errors', 'audit', *sys.argv[1:]])\n"
        f"heavy = {{m.split('.')[0] for m in sys.modules}} & {set(HEAVY_MODULES)!r}\n"
        "print(rc, sorted(heavy))\n"
    )
    args = [str(clean_tree), TREE_ARG, "--cache-dir", str(tmp_path / "c")]
    done = subprocess.run(
        [sys.executable, "-c", probe, *args, "--output", str(tmp_path / "out")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "1 []", done.stderr


def test_import_time_log_has_no_heavy_module() -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "vllm_omni_errors_audit", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    imported = {
        line.rsplit("|", 1)[-1].strip().split(".")[0]
        for line in done.stderr.splitlines()
    }
    assert done.returncode == 0
    assert imported.isdisjoint(HEAVY_MODULES)


def test_bad_files_are_findings_and_the_rest_is_audited(
    run_cli: RunCli, tmp_path: Path
) -> None:
    root = tmp_path / "mixed"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "latin.py").write_bytes(b'name = "caf\xe9"\n')
    (root / "pkg" / "broken.py").write_text("def f(:\n    raise\n")
    (root / "pkg" / "ok.py").write_text("raise TypeError('x')\n")
    done = run_cli(str(root), "--format", "json")
    report = json.loads(done.stdout)
    found = sorted((Path(f["path"]).name, f["rule"]) for f in report["findings"])
    assert done.returncode == 1
    assert found == [
        ("broken.py", "OMNI000"),
        ("latin.py", "OMNI000"),
        ("ok.py", "OMNI001"),
    ]


def test_an_internal_error_exits_3_not_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A bug in the audit cannot be provoked through a real tree any more
    # (every bad input is a finding), so one is planted in the scanner.
    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("planted")

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(runner, "scan_files", broken)
    status = cli.main([TREE_ARG, "--cache-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == cli.EXIT_INTERNAL == 3
    assert err.startswith("vllm-omni errors audit: internal error: KeyError: 'planted'")


def test_the_guide_documents_every_exit_status_and_rule(run_cli: RunCli) -> None:
    guide = (REPO / "docs" / "errors" / "migration.md").read_text()
    table = guide.split("| exit status | meaning |\n| ---: | --- |\n", 1)[1]
    documented = [int(row.split("|")[1]) for row in table.split("\n\n")[0].splitlines()]
    codes = [cli.EXIT_CLEAN, cli.EXIT_FINDINGS, cli.EXIT_USAGE, cli.EXIT_INTERNAL]
    assert documented == codes == [0, 1, 2, 3]
    assert [f"### {rule.id} {rule.name}" in guide for rule in RULES] == [True] * 6
    for option in (
        "--root",
        "--sarif-max-results",
        "--sarif-include-allowlisted",
        "--fix",
        "--suggest",
    ):
        assert option in guide
        assert option in run_cli("--help").stdout
