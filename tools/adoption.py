"""The patch series that takes this tree's error handling into vllm-omni.

    python tools/adoption.py pristine DIR    # vllm-omni 0.30.0's source as a git repo
    python tools/adoption.py patched DIR     # the same, the series applied (git am)
    python tools/adoption.py regenerate      # rebuild adoption/*.patch from this tree
    python tools/adoption.py check           # fail when adoption/*.patch is stale

The pristine tree is the published wheel's ``vllm_omni/`` committed at the
root of an empty git repository (the wheel is the one source of 0.30.0 on
the index; pip's cache keeps it). ``regenerate`` replays the phases of
docs/adoption.md on a pristine tree, one commit each, and writes them with
``git format-patch`` into ``adoption/``: what comes from this tree (the
errors package, the audit's ``--fix``) is taken fresh, the reviewed hand
changes of each phase (``adoption/hand/<phase>/*.diff``) are applied with
``git apply --3way``, so the series rebases onto a newer vllm-omni by
running it against that tree (``--base DIR``).

Only the standard library, git and pip: it runs from any Python.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERIES = ROOT / "adoption"
HAND = SERIES / "hand"
WHEEL = "vllm-omni==0.30.0"
AUTHOR = ("vLLM-Omni error handling", "errors@vllm-omni.invalid")
DATE = "2026-12-06T00:00:00+00:00"


def git(tree: Path, *args: str, **kwargs: object) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": AUTHOR[0],
        "GIT_AUTHOR_EMAIL": AUTHOR[1],
        "GIT_COMMITTER_NAME": AUTHOR[0],
        "GIT_COMMITTER_EMAIL": AUTHOR[1],
        "GIT_AUTHOR_DATE": DATE,
        "GIT_COMMITTER_DATE": DATE,
    }
    done = subprocess.run(
        ["git", "-C", str(tree), *args],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        **kwargs,  # type: ignore[arg-type]
    )
    return done.stdout


def pristine(target: Path, python: str = sys.executable) -> Path:
    """vllm-omni 0.30.0's ``vllm_omni/`` committed at the root of a new repo."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            [python, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", scratch],
            check=True,
        )
        (wheel,) = Path(scratch).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if member.startswith("vllm_omni/"):
                    archive.extract(member, target)
    git(target, "init", "-q", "-b", "main")
    git(target, "add", "-A")
    git(
        target,
        "commit",
        "-q",
        "-m",
        "vllm-omni 0.30.0 (the published wheel's vllm_omni/)",
    )
    return target


def patched(target: Path, python: str = sys.executable) -> Path:
    """The pristine tree with ``adoption/*.patch`` applied in name order."""
    pristine(target, python)
    patches = sorted(SERIES.glob("*.patch"))
    if patches:
        git(target, "am", "-q", "--whitespace=nowarn", *map(str, patches))
    return target


@dataclass(frozen=True)
class Phase:
    """One commit of the series: its message and how it is made."""

    name: str
    message: str


def _message(phase: str) -> str:
    return (SERIES / "messages" / f"{phase}.txt").read_text()


def _apply_hand(tree: Path, phase: str) -> None:
    for diff in sorted((HAND / phase).glob("*.diff")):
        git(tree, "apply", "--3way", "--whitespace=nowarn", str(diff))


def _copy_errors_package(tree: Path) -> None:
    """This tree's ``vllm_omni/errors/`` and ``upstream.py`` replace 0.30's
    ``vllm_omni/errors.py`` (the package keeps every name it exported)."""
    (tree / "vllm_omni" / "errors.py").unlink(missing_ok=True)
    destination = tree / "vllm_omni" / "errors"
    if destination.exists():
        shutil.rmtree(destination)
    shutil.copytree(
        ROOT / "vllm_omni" / "errors",
        destination,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    shutil.copy2(ROOT / "vllm_omni" / "upstream.py", tree / "vllm_omni" / "upstream.py")


# What stays of the audit's findings in entrypoints/, each with its reason
# (phase 3b's hand change adds it at the root of the vllm-omni tree).
ALLOWLIST = "errors-audit-allowlist.toml"


def _audit(tree: Path, python: str, *options: str, clean: bool = False) -> None:
    """The migration audit on the tree's ``entrypoints/`` (tools/errors_audit;
    it must be installed for ``python``): ``--fix`` makes the rewrites that
    keep every status; ``clean`` requires no finding (outside an
    ``--allowlist``)."""
    done = subprocess.run(
        [
            python,
            "-m",
            "vllm_omni_errors_audit",
            "vllm_omni/entrypoints",
            "--root",
            ".",
            "--no-cache",
            *options,
        ],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    # 1: findings remain (the ones that need judgement); 0: none.
    if done.returncode not in ((0,) if clean else (0, 1)):
        raise RuntimeError(f"the audit failed:\n{done.stdout}{done.stderr}")


def _commit(tree: Path, phase: str) -> None:
    git(tree, "add", "-A")
    message = _message(phase)
    git(tree, "commit", "-q", "-F", "-", input=message)


def regenerate(
    base: Path | None, python: str = sys.executable, out: Path = SERIES
) -> list[Path]:
    """Replay every phase on a pristine tree; write the series into ``out``."""
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "vllm-omni"
        if base is None:
            pristine(tree, python)
        else:
            shutil.copytree(base, tree, symlinks=True)
        start = git(tree, "rev-parse", "HEAD").strip()
        for phase in PHASES:
            if phase == "2-bridge":
                _copy_errors_package(tree)
            if phase == "3a-audit-fix":
                _audit(tree, python, "--fix")
            _apply_hand(tree, phase)
            if phase >= "3b-request-boundaries":
                # From the request boundaries on, every finding left in
                # entrypoints/ is allowlisted with its reason (a hand change
                # that adds a raw raise or broad except fails here).
                _audit(tree, python, "--allowlist", ALLOWLIST, clean=True)
            _commit(tree, phase)
        for old in out.glob("*.patch"):
            old.unlink()
        git(
            tree,
            "format-patch",
            "-q",
            "--no-signature",
            "--zero-commit",
            "-o",
            str(out),
            f"{start}..HEAD",
        )
        return sorted(out.glob("*.patch"))


def check(python: str = sys.executable) -> int:
    """0 when ``adoption/*.patch`` is what ``regenerate`` makes now."""
    with tempfile.TemporaryDirectory() as scratch:
        fresh = {p.name: p.read_text() for p in regenerate(None, python, Path(scratch))}
        committed = {p.name: p.read_text() for p in SERIES.glob("*.patch")}
    if fresh == committed:
        print(f"adoption/: the {len(fresh)} patches are current")
        return 0
    stale = sorted(
        n for n in fresh.keys() | committed.keys() if fresh.get(n) != committed.get(n)
    )
    print(
        f"adoption/ is stale ({', '.join(stale)}): "
        "run python tools/adoption.py regenerate"
    )
    return 1


PHASES = sorted(p.stem for p in (SERIES / "messages").glob("*.txt"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("pristine", "patched"):
        command = commands.add_parser(name)
        command.add_argument("target", type=Path)
    commands.add_parser("check", help="fail when adoption/*.patch is stale")
    again = commands.add_parser("regenerate")
    again.add_argument("--base", type=Path, default=None, help="a vllm-omni git tree")
    options = parser.parse_args(argv)
    if options.command == "pristine":
        print(pristine(options.target))
    elif options.command == "patched":
        print(patched(options.target))
    elif options.command == "check":
        return check()
    else:
        for path in regenerate(options.base):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
