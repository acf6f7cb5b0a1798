"""The checked-in lock covers the dependencies of both pyprojects (the
runtime's and the audit tool's, tools/errors_audit), and the README's two
lines install from it.

A new machine resolves what the lock pins (`pip install -c
requirements/lock.txt …`); a dependency added to pyproject without re-running
``requirements/lock.sh`` would resolve freely there, so this test fails first.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"
TOOL = ROOT / "tools" / "errors_audit"


def _locked() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in LOCK.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep, f"lock line is not an exact pin: {line!r}"
        pins[canonicalize_name(name)] = Version(version)
    return pins


def _declared() -> list[Requirement]:
    """The runtime's dependencies and extras, and the audit tool's (README
    line 2 installs both from the lock)."""
    declared: list[Requirement] = []
    for pyproject in (ROOT / "pyproject.toml", TOOL / "pyproject.toml"):
        project = tomllib.loads(pyproject.read_text())["project"]
        declared += [Requirement(spec) for spec in project["dependencies"]]
        for specs in project.get("optional-dependencies", {}).values():
            declared += [Requirement(spec) for spec in specs]
    return declared


def test_lock_pins_every_declared_dependency_within_its_range() -> None:
    pins = _locked()
    problems = []
    for requirement in _declared():
        if canonicalize_name(requirement.name) == "vllm-omni":
            continue  # an extra that names the project's own other extras
        pinned = pins.get(canonicalize_name(requirement.name))
        if pinned is None:
            problems.append(f"{requirement.name}: not in the lock")
        elif not requirement.specifier.contains(pinned, prereleases=True):
            problems.append(
                f"{requirement.name}: lock has {pinned}, wants {requirement}"
            )
    assert problems == [], "re-run requirements/lock.sh:\n" + "\n".join(problems)


def test_readme_lines_install_from_the_lock() -> None:
    first, second = (ROOT / "README.md").read_text().splitlines()[:2]
    assert first == (
        "pip install -c requirements/lock.txt -e . && "
        "vllm-omni serve --pipeline reference --port 8000"
    )
    assert second == (
        "pip install -c requirements/lock.txt -e '.[test]' -e tools/errors_audit "
        "&& python -m pytest -q"
    )
    # .ci/run runs README line 2 itself, in a fresh virtualenv.
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'test_line="$(sed -n 2p README.md)"' in ci
    assert 'rm -rf "$venv"' in ci


def _closure(distribution: str) -> set[str]:
    """The installed distributions ``distribution`` needs, without extras."""
    seen: set[str] = set()
    todo = [distribution]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # a dependency for another platform, not installed here
        for spec in requires:
            requirement = Requirement(spec)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def test_the_runtime_needs_no_codemod_library_and_builds_no_extension() -> None:
    """What only the audit needs is the audit's (docs/design.md §11)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "ext-modules" not in pyproject["tool"]["setuptools"]
    assert not list((ROOT / "vllm_omni").rglob("*.c"))
    runtime = _closure("vllm-omni")
    assert {"vllm", "fastapi", "jsonschema-rs"} <= runtime
    assert "libcst" not in runtime
    assert "libcst" in _closure("vllm-omni-errors-audit")
