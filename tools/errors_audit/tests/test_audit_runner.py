"""Discovery, the content-hash cache and the process pool give one answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from audit_testing import REPO, TREE_ARG
from vllm_omni_errors_audit import cache as cache_module
from vllm_omni_errors_audit import runner
from vllm_omni_errors_audit.cache import ScanCache
from vllm_omni_errors_audit.scanner import FileResult
from vllm_omni_errors_audit.usage import AuditUsageError


def _audit(cache: ScanCache | None, *, jobs: int = 1) -> runner.Report:
    return runner.run_audit([TREE_ARG], jobs=jobs, cache=cache)


def _never_scan(data: bytes) -> FileResult:
    raise AssertionError("a warm run must not parse")


@pytest.fixture(autouse=True)
def _at_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def test_warm_run_parses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cold = _audit(ScanCache(tmp_path))
    monkeypatch.setattr(runner, "scan", _never_scan)
    warm = _audit(ScanCache(tmp_path))
    assert warm == cold


def test_a_cold_run_reads_each_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With nothing cached there is nothing to look up: the scanner reads and
    # hashes each file, the caller does not read it first. A warm run reads
    # each file once too (to hash it), and parses none.
    reads: list[Path] = []
    read_regular = runner.read_regular

    def counted(path: Path) -> bytes:
        reads.append(path)
        return read_regular(path)

    monkeypatch.setattr(runner, "read_regular", counted)
    cold = _audit(ScanCache(tmp_path))
    assert len(reads) == cold.files == 6
    assert len(set(reads)) == len(reads)
    reads.clear()
    monkeypatch.setattr(runner, "scan", _never_scan)
    assert _audit(ScanCache(tmp_path)) == cold
    assert len(reads) == cold.files


def test_changed_bytes_are_parsed_again(tmp_path: Path) -> None:
    source = tmp_path / "tree" / "pkg" / "mod.py"
    source.parent.mkdir(parents=True)
    source.write_text("raise RuntimeError('x')\n")
    cache_dir = tmp_path / "cache"
    first = runner.run_audit(
        [str(tmp_path / "tree")], jobs=1, cache=ScanCache(cache_dir)
    )
    source.write_text("raise ValueError('x')\n")
    second = runner.run_audit(
        [str(tmp_path / "tree")], jobs=1, cache=ScanCache(cache_dir)
    )
    assert (first.findings, [f.rule for f in second.findings]) == ([], ["OMNI001"])


def test_a_corrupt_cache_is_an_empty_cache(tmp_path: Path) -> None:
    expected = _audit(None)
    for name in ("x", "[1, 2]", '{"abc": [1]}'):
        path = tmp_path / f"scan-{cache_module.audit_version()}.json"
        path.write_text(name)
        assert _audit(ScanCache(tmp_path)) == expected


def test_process_pool_matches_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    serial = _audit(None)
    monkeypatch.setattr(runner, "_PARALLEL_MIN_FILES", 1)
    assert _audit(None, jobs=2) == serial


def test_discovery_skips_hidden_and_cache_folders(tmp_path: Path) -> None:
    for name in (".venv/a.py", "__pycache__/b.py", "pkg/c.py", "d.py", "e.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    _, files = runner.discover([str(tmp_path), str(tmp_path / "d.py")])
    assert [(f.path.name, f.folder) for f in files] == [("d.py", "."), ("c.py", "pkg")]


def test_a_missing_path_is_a_usage_error() -> None:
    with pytest.raises(AuditUsageError, match="no-such-dir"):
        runner.discover(["no-such-dir"])
