"""Benchmark ``vllm-omni errors audit`` against ``ruff check --select TRY,EM``.

Two real trees, each read by both tools in the same run: the published
``vllm-omni`` 0.30.0 wheel (about 1,600 files, 24 MB of Python; downloaded
once with pip into ``$XDG_CACHE_HOME/vllm-omni/bench``) and the installed
vLLM package (about 3,200 files; found without importing it). A folder given
as the first argument (or ``$VLLM_OMNI_AUDIT_BENCH_TREE``) replaces both.

Each command is timed as a subprocess from start to exit: the audit with an
empty cache (cold) and again with the cache that run left (warm); the audit
with ``--fix`` on a fresh copy of the tree with an empty cache (the copy is
made before the clock starts: ``--fix`` rewrites it); ruff's tryceratops
and flake8-errmsg rules without its cache. Ruff does a different (smaller)
job; it is the speed reference for "a linter over this tree", not an
equivalent. Targets: cold at most 2x ruff, warm at most 0.5x (issue 16),
``--fix`` at most 3x (issue 25); each row says ``ok`` or ``NOT OK``
(``python -m benchmarks`` exits 1 on any row that is not), and the load
average before and after is printed: on a shared machine the ratios move
with it. The ``cpu ratio`` column compares
CPU seconds (user + system, worker processes included), which load moves
much less: on a busy machine the wall ratio tends towards it.

``python benchmarks/bench_audit.py [TREE]`` prints a table; ``run()``
returns the rows for ``python -m benchmarks``.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.paired import met

WHEEL = "vllm-omni==0.30.0"
TREE_ENV = "VLLM_OMNI_AUDIT_BENCH_TREE"
REPEATS_ENV = "VLLM_OMNI_BENCH_REPEATS"
# The audit exits 1 when it has findings, ruff when it has violations.
_OK_EXIT = (0, 1)
TARGETS = {"audit cold": 2.0, "audit warm": 0.5, "audit --fix": 3.0}


def run(
    tree: Path | None = None, repeats: int | None = None, *, quick: bool = False
) -> list[dict[str, object]]:
    """Time the audit (cold, warm) and ruff on each tree; the median of
    ``repeats`` runs each (``$VLLM_OMNI_BENCH_REPEATS``, default 3);
    ``quick``: once, on the 0.30.0 wheel's tree only."""
    repeats = 1 if quick else repeats or int(os.environ.get(REPEATS_ENV, "3"))
    trees = {"given": tree.resolve()} if tree is not None else default_trees()
    if quick and tree is None:
        trees = {"vllm-omni 0.30.0": trees["vllm-omni 0.30.0"]}
    rows: list[dict[str, object]] = []
    for label, root in trees.items():
        files = sum(1 for _ in root.rglob("*.py"))
        cold, warm, fix, ruff = [], [], [], []
        # Interleaved, so load from other processes hits all four alike.
        # From an empty folder: ``python -m`` puts the working directory
        # first on sys.path, and next to the wheel's tree that would run the
        # wheel's own vllm_omni instead of ours.
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as cache:
                audit = [*_audit_command(), str(root), "--cache-dir", cache]
                cold.append(_seconds(audit, Path(cache)))
                warm.append(_seconds(audit, Path(cache)))
                fix.append(_fix_seconds(root, Path(cache)))
                ruff.append(_seconds(_ruff_command(root), Path(cache)))
        baseline = statistics.median(wall for wall, _ in ruff)
        baseline_cpu = statistics.median(cpu for _, cpu in ruff)
        for kind, times in (("cold", cold), ("warm", warm), ("--fix", fix)):
            ours = statistics.median(wall for wall, _ in times)
            ours_cpu = statistics.median(cpu for _, cpu in times)
            rows.append(
                _row(f"audit {kind} ({label})", ours, baseline, files)
                | {
                    "target": f"<= {TARGETS[f'audit {kind}']}",
                    "cpu_ratio": ours_cpu / baseline_cpu,
                }
            )
    for row in rows:
        row["met"] = met(float(row["ratio"]), str(row["target"]))  # type: ignore[arg-type]
    return rows


def default_trees() -> dict[str, Path]:
    return {"vllm-omni 0.30.0": wheel_tree(), "vllm": installed_vllm()}


def wheel_tree(cache: Path | None = None) -> Path:
    """The 0.30.0 wheel's ``vllm_omni`` folder, downloaded and unpacked once."""
    tree = (cache or bench_cache()) / "vllm_omni-0.30.0" / "vllm_omni"
    return unpacked_wheel(WHEEL, tree)


def unpacked_wheel(requirement: str, tree: Path, *, sources_only: bool = False) -> Path:
    """``tree``, the package folder of ``requirement``'s wheel (``pip
    download --no-deps``), unpacked beside it once; ``sources_only`` keeps
    only the package's ``.py`` files (a large wheel's binaries are not read)."""
    if tree.is_dir():
        return tree
    with tempfile.TemporaryDirectory(dir=_made(tree.parent.parent)) as scratch:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                requirement,
                "-d",
                scratch,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (wheel,) = Path(scratch).glob("*.whl")
        unpacked = Path(scratch) / "unpacked"
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if not sources_only or (
                    name.startswith(f"{tree.name}/") and name.endswith(".py")
                ):
                    archive.extract(name, unpacked)
        wheel.unlink()
        # Renamed into place whole: a concurrent or interrupted run never
        # sees half a tree.
        try:
            unpacked.rename(tree.parent)
        except OSError:
            if not tree.is_dir():
                raise
    return tree


def installed_vllm() -> Path:
    """The installed vLLM package folder (found, never imported)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("vllm is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def bench_cache() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "vllm-omni" / "bench"


def main(argv: Sequence[str]) -> int:
    given = argv[0] if argv else os.environ.get(TREE_ENV)
    before = _load()
    rows = run(Path(given) if given else None)
    header = ("benchmark", "ours s", "ruff s", "ratio", "target", "", "cpu ratio")
    print("{:<32} {:>7} {:>7} {:>6} {:>7} {:<7} {:>9}".format(*header))
    for row in rows:
        verdict = "met" if row["met"] else "NOT MET"
        print(
            f"{row['benchmark']:<32} {row['ours']:>7.2f} {row['baseline']:>7.2f} "
            f"{row['ratio']:>6.2f} {row['target']:>7} {verdict:<7} "
            f"{row['cpu_ratio']:>9.2f}"
        )
    # Both tools share the machine with whatever else runs: say how busy it was.
    print(f"load average (1 min): {before} before, {_load()} after")
    return 0


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "unknown"


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _row(name: str, ours: float, baseline: float, files: int) -> dict[str, object]:
    return {
        "benchmark": name,
        "ours": ours,
        "baseline": baseline,
        "ratio": ours / baseline,
        "unit": "s",
        "files": files,
        "files_per_s": files / ours,
    }


def _audit_command() -> list[str]:
    # This interpreter and its sys.path (a worktree on PYTHONPATH included),
    # not whichever checkout a ``vllm-omni`` console script was installed from.
    return [sys.executable, "-m", "vllm_omni_errors_audit"]


def _fix_seconds(root: Path, scratch: Path) -> tuple[float, float]:
    """``--fix`` (cold) on a copy of ``root`` made in ``scratch`` first."""
    copy = scratch / "fix" / root.name
    shutil.copytree(root, copy)
    command = [
        *_audit_command(),
        str(copy),
        "--fix",
        "--cache-dir",
        str(copy.parent / "cache"),
    ]
    return _seconds(command, scratch)


def _ruff_command(root: Path) -> list[str]:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    # --isolated: no pyproject of ours (or theirs) changes what ruff checks.
    return [
        ruff,
        "check",
        "--select",
        "TRY,EM",
        "--no-cache",
        "--isolated",
        "--quiet",
        str(root),
    ]


def _seconds(command: list[str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, worker processes
    included) of one run of ``command``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # Exit 1 is also Python's status for a crash: "findings" counts only
    # with its output (the audit's report, ruff's diagnostics).
    crashed = done.returncode == 1 and not done.stdout.strip()
    if done.returncode not in _OK_EXIT or crashed:
        raise RuntimeError(f"{command[0]} failed ({done.returncode}): {done.stderr}")
    return elapsed, cpu


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
