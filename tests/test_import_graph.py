"""No import circle in ``vllm_omni/`` (docs/design.md §11).

What counts as an import is ``tests/import_graph.py``'s reading of the
source: imports inside functions and ``TYPE_CHECKING`` blocks, modules named
to ``importlib``, names a package loads through its lazy ``__getattr__``.
"""

from __future__ import annotations

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
