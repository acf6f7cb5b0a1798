"""No import circle in ``vllm_omni/``, and its layers point down
(docs/design.md §1, §11).

What counts as an import is ``tests/import_graph.py``'s reading of the
source: imports inside functions and ``TYPE_CHECKING`` blocks, modules named
to ``importlib``, names a package loads through its lazy ``__getattr__``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.import_graph import circles, import_graph

ROOT = Path(__file__).resolve().parents[1]


def test_vllm_omni_has_no_import_circle() -> None:
    graph = import_graph(ROOT, "vllm_omni")
    assert len(graph) > 50, "the package was not found"
    found = circles(graph)
    described = [
        " → ".join(component)
        + "\n"
        + "\n".join(
            f"    {a} imports {b}"
            for a in component
            for b in sorted(graph[a] & set(component))
        )
        for component in found
    ]
    assert not found, "import circles:\n" + "\n".join(described)


# docs/design.md §1's layers, lowest first: a module imports only from its
# own layer and those below it. The package itself is above them all (it
# loads ``Omni`` and ``AsyncOmni`` lazily).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("vllm_omni.upstream", "vllm_omni.version"),
    ("vllm_omni.errors",),
    ("vllm_omni.config", "vllm_omni.outputs", "vllm_omni.pipelines"),
    ("vllm_omni.tracing",),
    ("vllm_omni.wire",),
    ("vllm_omni.stages",),
    ("vllm_omni.engine",),
    ("vllm_omni.entrypoints",),
)


def _layer(module: str) -> int:
    if module == "vllm_omni":
        return len(LAYERS)
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} is in no layer of docs/design.md §1")


def test_layers_point_down() -> None:
    graph = import_graph(ROOT, "vllm_omni")
    upward = [
        f"{importer} imports {imported}"
        for importer, imports in sorted(graph.items())
        for imported in sorted(imports)
        if _layer(imported) > _layer(importer)
    ]
    assert upward == []


def _design_layers() -> list[tuple[str, ...]]:
    """The first cell of each row of docs/design.md §1's table, as modules:
    ``vllm_omni/errors/`` and a bare ``outputs.py`` beside it."""
    design = (ROOT / "docs" / "design.md").read_text()
    section = design.split("## §1", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        first = line.split("|")[1] if line.startswith("| `vllm_omni/") else ""
        names = re.findall(r"`([^`]+)`", first)
        if names:
            rows.append(
                tuple(
                    "vllm_omni."
                    + name.removeprefix("vllm_omni/").removesuffix(".py").strip("/")
                    for name in names
                )
            )
    return rows


def test_the_design_lists_these_layers() -> None:
    assert [tuple(sorted(row)) for row in _design_layers()] == [
        tuple(sorted(row)) for row in LAYERS
    ]


def _engine_floors() -> list[tuple[str, ...]]:
    """docs/design.md §1's table of ``vllm_omni/engine/``'s floors, lowest
    first, as modules."""
    design = (ROOT / "docs" / "design.md").read_text()
    section = design.split("## §1", 1)[1].split("\n## ", 1)[0]
    table = section.split("| engine floor |", 1)[1].split("\n\n", 1)[0]
    return [
        tuple(
            "vllm_omni.engine." + name.removesuffix(".py")
            for name in re.findall(r"`([^`]+\.py)`", line.split("|")[1])
        )
        for line in table.splitlines()[2:]
    ]


def test_engine_modules_point_down_their_floors() -> None:
    """The orchestrator's collaborators never import it, the stage side never
    imports the orchestrator's side, and every engine module has a floor."""
    floors = _engine_floors()
    floor = {module: index for index, row in enumerate(floors) for module in row}
    graph = import_graph(ROOT, "vllm_omni")
    modules = {m for m in graph if m.startswith("vllm_omni.engine.")}
    assert sorted(modules - set(floor)) == []
    upward = [
        f"{importer} imports {imported}"
        for importer in sorted(modules)
        for imported in sorted(graph[importer])
        if imported in floor and floor[imported] > floor[importer]
    ]
    assert upward == []


def _tree(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param(
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "def f():\n    from pkg import b\n",
                "pkg/b.py": "from . import a\n",
            },
            [["pkg.a", "pkg.b"]],
            id="an import inside a function closes a circle",
        ),
        pytest.param(
            {
                "pkg/__init__.py": (
                    "import importlib\n"
                    "_LAZY = {'thing': 'pkg.impl'}\n"
                    "def __getattr__(name):\n"
                    "    return getattr(importlib.import_module(_LAZY[name]), name)\n"
                ),
                "pkg/impl.py": "from pkg.user import helper\nthing = 1\n",
                "pkg/user.py": "from pkg import thing\ndef helper(): ...\n",
            },
            [["pkg.impl", "pkg.user"]],
            id="a circle through a package's lazy __getattr__",
        ),
        pytest.param(
            {
                "pkg/__init__.py": (
                    "import importlib\n"
                    "_M = 'pkg.impl'\n"
                    "_LAZY = {**{n: _M for n in ('x', 'y')}}\n"
                    "def __getattr__(name):\n"
                    "    return getattr(importlib.import_module(_LAZY[name]), name)\n"
                ),
                "pkg/impl.py": "from pkg.user import helper\nx = y = 1\n",
                "pkg/user.py": "from pkg import y\ndef helper(): ...\n",
            },
            [["pkg.impl", "pkg.user"]],
            id="a lazy table built by a comprehension",
        ),
        pytest.param(
            {
                "pkg/__init__.py": "",
                "pkg/cli.py": (
                    "import importlib\n"
                    "COMMANDS = {'serve': 'pkg.serve:main'}\n"
                    "def main(): importlib.import_module('pkg.serve')\n"
                ),
                "pkg/serve.py": "from pkg.cli import COMMANDS\n",
            },
            [["pkg.cli", "pkg.serve"]],
            id="a module loaded by name through importlib",
        ),
        pytest.param(
            {
                "pkg/__init__.py": "__version__ = '1'\nfrom pkg import a\n",
                "pkg/a.py": "from pkg import __version__\nfrom . import b\n",
                "pkg/b.py": "from .c import x\n",
                "pkg/c.py": "x = 1\n",
            },
            [],
            id="a package's own __version__ and a tree that only points down",
        ),
    ],
)
def test_the_check_finds_circles_of_every_kind(
    tmp_path: Path, files: dict[str, str], expected: list[list[str]]
) -> None:
    _tree(tmp_path, files)
    assert circles(import_graph(tmp_path, "pkg")) == expected
