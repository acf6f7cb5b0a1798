"""Benchmark ``vllm-omni errors audit`` against ``ruff check --select TRY``.

Both tools read the same tree: by default the published ``vllm-omni``
0.30.0 wheel (about 1,600 files, 24 MB of Python), downloaded with pip into
a temporary folder; or a folder given as the first argument or in
``$VLLM_OMNI_AUDIT_BENCH_TREE``. Each command is timed as a subprocess from
start to exit: the audit with an empty cache (cold) and again with the cache
that run left (warm), ruff's tryceratops rules without its cache. Ruff does
a different (smaller) job; it is the speed reference for "an AST linter
over this tree", not an equivalent.

``python benchmarks/bench_audit.py [TREE]`` prints a table; ``run()``
returns the rows for ``python -m benchmarks``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

WHEEL = "vllm-omni==0.30.0"
TREE_ENV = "VLLM_OMNI_AUDIT_BENCH_TREE"
REPEATS_ENV = "VLLM_OMNI_BENCH_REPEATS"
# The audit exits 1 when it has findings, ruff when it has violations.
_OK_EXIT = (0, 1)


def run(
    tree: Path | None = None, repeats: int | None = None
) -> list[dict[str, object]]:
    """Time the audit (cold, warm) and ruff TRY on ``tree``; the median of
    ``repeats`` runs each (``$VLLM_OMNI_BENCH_REPEATS``, default 3)."""
    repeats = repeats or int(os.environ.get(REPEATS_ENV, "3"))
    with _benchmark_tree(tree) as root:
        files = sum(1 for _ in root.rglob("*.py"))
        cold, warm = [], []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as cache:
                audit = [*_audit_command(), str(root), "--cache-dir", cache]
                cold.append(_seconds(audit, root.parent))
                warm.append(_seconds(audit, root.parent))
        ruff = [_seconds(_ruff_command(root), root.parent) for _ in range(repeats)]
    baseline = statistics.median(ruff)
    return [
        _row(name, statistics.median(times), baseline, files)
        for name, times in (("audit cold", cold), ("audit warm", warm))
    ]


def main(argv: Sequence[str]) -> int:
    given = argv[0] if argv else os.environ.get(TREE_ENV)
    rows = run(Path(given) if given else None)
    header = ("benchmark", "ours s", "ruff TRY s", "ratio", "files/s")
    print("{:<12} {:>8} {:>11} {:>6} {:>9}".format(*header))
    for row in rows:
        print(
            f"{row['benchmark']:<12} {row['ours']:>8.2f} {row['baseline']:>11.2f} "
            f"{row['ratio']:>6.2f} {row['files_per_s']:>9,.0f}"
        )
    files, ruff_rate = rows[0]["files"], rows[0]["baseline_files_per_s"]
    print(f"{files} files; ruff TRY: {ruff_rate:,.0f} files/s")
    return 0


def _row(name: str, ours: float, baseline: float, files: int) -> dict[str, object]:
    return {
        "benchmark": name,
        "ours": ours,
        "baseline": baseline,
        "ratio": ours / baseline,
        "unit": "s",
        "files": files,
        "files_per_s": files / ours,
        "baseline_files_per_s": files / baseline,
    }


@contextmanager
def _benchmark_tree(given: Path | None) -> Iterator[Path]:
    if given is not None:
        yield given.resolve()
        return
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                WHEEL,
                "-d",
                scratch,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (wheel,) = Path(scratch).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(Path(scratch) / "tree")
        yield Path(scratch) / "tree" / "vllm_omni"


def _audit_command() -> list[str]:
    script = shutil.which("vllm-omni")
    if script is not None:
        return [script, "errors", "audit"]
    return [sys.executable, "-m", "vllm_omni.errors.audit"]


def _ruff_command(root: Path) -> list[str]:
    ruff = shutil.which("ruff") or "ruff"
    # --isolated: no pyproject of ours (or theirs) changes what ruff checks.
    return [ruff, "check", "--select", "TRY", "--no-cache", "--isolated", str(root)]


def _seconds(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    elapsed = time.perf_counter() - start
    if done.returncode not in _OK_EXIT:
        raise RuntimeError(f"{command[0]} failed ({done.returncode}): {done.stderr}")
    return elapsed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
