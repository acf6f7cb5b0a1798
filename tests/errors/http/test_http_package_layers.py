"""The package's shape (docs/design.md §11): layers point down, every import
at module level, no module reads another's underscore names, and nothing
below the package imports it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.import_graph import module_names

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = "vllm_omni.errors.http"
# Each module's layer: a module imports only modules of lower layers. The
# package's own ``__init__`` is its front door and may import any of them.
LAYERS = {
    "register": 4,
    "boundary": 3,
    "handlers.unmatched": 3,
    "failures": 2,
    "limits": 2,
    "disconnects": 2,
    "handlers.http_exceptions": 2,
    "handlers.validation": 2,
    "handlers.safety_net": 2,
    "reporting": 1,
    "request_ids": 1,
    "termination": 1,
    "websocket": 1,
    "schema": 1,
    "handlers": 1,
}


def _modules(package: str) -> dict[str, Path]:
    """The modules of ``package``, named relative to it ("" is its ``__init__``)."""
    return {
        name.removeprefix(package).removeprefix("."): path
        for name, path in module_names(ROOT, package.replace(".", "/")).items()
    }


def _imports(path: Path) -> list[tuple[ast.stmt, bool, str, list[str]]]:
    """Every import statement of ``path``, wherever it stands: (node, whether
    at module level, module, imported names)."""
    tree = ast.parse(path.read_text())
    found: list[tuple[ast.stmt, bool, str, list[str]]] = []
    for node in ast.walk(tree):
        top = node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import"
            found.append((node, top, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node, top, a.name, []) for a in node.names]
    return found


MODULES = _modules(PACKAGE)


def test_every_module_has_a_layer() -> None:
    assert set(MODULES) - {""} == set(LAYERS)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_imports_point_down_and_stand_at_module_level(name: str) -> None:
    for node, top, module, names in _imports(MODULES[name]):
        assert top, f"{name}:{node.lineno}: import inside a block"
        if not module.startswith("vllm_omni."):
            continue
        assert not any(n.startswith("_") for n in names), (
            f"{name}:{node.lineno}: imports a private name of {module}"
        )
        if module == PACKAGE:
            pytest.fail(f"{name}:{node.lineno}: imports the package's front door")
        if module.startswith(PACKAGE + "."):
            target = module.removeprefix(PACKAGE + ".")
            assert LAYERS[target] < LAYERS[name], f"{name} imports up: {target}"


def test_nothing_below_imports_the_boundary() -> None:
    below = {
        name: path
        for name, path in _modules("vllm_omni.errors").items()
        if name and not name.startswith("http")
    }
    assert below
    for name, path in below.items():
        for _, _, module, _ in _imports(path):
            assert not module.startswith(PACKAGE), f"errors.{name} imports {module}"
