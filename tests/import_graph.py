"""The import graph of a source tree, read from the source (docs/design.md §11).

Every ``import`` and ``from … import`` counts wherever it stands (a function
body, a ``TYPE_CHECKING`` block), and so does a module named by a string
literal that is handed to ``importlib`` (a command table, a stage registry).
``from pkg import name`` where the package resolves ``name`` lazily (a
``__getattr__`` reading a table of module names) is an edge to the module
that table names, since that is what the statement loads. Importing one's
own package's dunder (``from vllm_omni import __version__``) is not an edge:
it runs nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

__all__ = ["circles", "import_graph", "module_names"]


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` below ``root``: dotted name → file."""
    modules: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(
    importer: str, is_package: bool, module: str | None, level: int
) -> str | None:
    if level == 0:
        return module
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _strings(node: ast.AST) -> Iterator[str]:
    for child in ast.walk(node):
        if isinstance(child, ast.Constant) and isinstance(child.value, str):
            yield child.value


def lazy_table(tree: ast.Module, modules: dict[str, Path]) -> dict[str, str]:
    """A package's lazily loaded names → the module each comes from.

    Read from the module-level dict literals (and ``{name: MODULE for name in
    (...)}`` comprehensions) whose values name a module of the tree, either
    as ``"package.module"`` or ``"package.module:attribute"``.
    """
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }

    def value_of(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            text = constants.get(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            return None
        name = text.split(":")[0] if text else None
        return name if name in modules else None

    table: dict[str, str] = {}

    def read(node: ast.expr) -> None:
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if key is None:
                    read(value)
                elif isinstance(key, ast.Constant) and isinstance(key.value, str):
                    target = value_of(value)
                    if target:
                        table[key.value] = target
        elif isinstance(node, ast.DictComp):
            target = value_of(node.value)
            if target:
                for generator in node.generators:
                    for name in _strings(generator.iter):
                        table[name] = target

    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            read(node.value)
    return table


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module → the modules of the same tree it imports (see module doc)."""
    modules = module_names(root, package)
    trees = {name: ast.parse(path.read_text()) for name, path in modules.items()}
    lazy = {
        name: lazy_table(tree, modules)
        for name, tree in trees.items()
        if modules[name].name == "__init__.py"
        and any(
            isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
            for node in tree.body
        )
    }

    def owning(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for importer, tree in trees.items():
        is_package = modules[importer].name == "__init__.py"
        edges = graph[importer]
        uses_importlib = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    uses_importlib |= alias.name == "importlib"
                    target = owning(alias.name)
                    if target:
                        edges.add(target)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(importer, is_package, node.module, node.level)
                if base is None:
                    continue
                uses_importlib |= base == "importlib"
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    if submodule in modules:
                        edges.add(submodule)
                    elif base in lazy and alias.name in lazy[base]:
                        edges.add(lazy[base][alias.name])
                    elif alias.name.startswith("__") and importer.startswith(
                        f"{base}."
                    ):
                        continue
                    elif (target := owning(base)) is not None:
                        edges.add(target)
        if uses_importlib:
            lazily_loaded = set(lazy.get(importer, {}).values())
            for text in _strings(tree):
                name = text.split(":")[0]
                if name in modules and name not in lazily_loaded:
                    edges.add(name)
        edges.discard(importer)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found
