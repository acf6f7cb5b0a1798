"""The published vllm-omni 0.30.0 tree, read and run at test time, never copied.

The wheel is downloaded once with pip into the bench cache
(``benchmarks.bench_audit.wheel_tree``, as the audit's real-tree tests do);
without a reachable index the tests that need it are skipped, saying why.

Only code that runs without the rest of 0.30 (CUDA, torch, its own
packages) is executed, cut out of the wheel's source with ``ast``:

- ``vllm_omni/errors.py`` whole (it imports only the standard library);
- the wire Structs ``EngineQueueMessage`` and ``ErrorMessage`` of
  ``vllm_omni/engine/messages.py`` (with their ``msgspec``/``typing``
  imports; the other Structs need 0.30's packages);
- single classes (its ``OmniEngineDeadError``), functions (a classmethod
  of an output class, the receiving methods of ``OmniBase``) and
  expressions (the diffusion process's error dict), run in a namespace the
  test gives them: that is how 0.30's code is made to run against *this*
  tree's ``vllm_omni.errors``, as it would once this package replaced its
  ``errors.py``.
"""

from __future__ import annotations

import ast
import copy
import subprocess
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench_audit import wheel_tree

__all__ = [
    "class_030",
    "dict_expressions",
    "errors_030",
    "evaluate",
    "fields_030",
    "free_names",
    "function_030",
    "messages_030",
    "methods_030",
    "parse",
    "tree_030",
]

# Imports the cut-out wire Structs need; everything else in messages.py is
# 0.30's own packages and vLLM's engine, which the error Struct does not use.
_STRUCT_IMPORTS = frozenset({"__future__", "typing", "msgspec"})
_STRUCTS = ("EngineQueueMessage", "ErrorMessage")


@cache
def _tree() -> Path | str:
    try:
        return wheel_tree()
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"the vllm-omni 0.30.0 wheel cannot be downloaded here: {exc}"


def tree_030() -> Path:
    """The wheel's ``vllm_omni`` folder; skips the test when it cannot be had."""
    tree = _tree()
    if isinstance(tree, str):
        pytest.skip(tree)
    return tree


def parse(relative: str) -> ast.Module:
    """A file of the 0.30 tree, parsed (``relative`` to its ``vllm_omni``);
    a fresh tree each time, which the caller may change."""
    return copy.deepcopy(_parsed(tree_030() / relative))


@cache
def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_bytes(), filename=str(path))


def _module(name: str, body: list[ast.stmt], filename: str) -> types.ModuleType:
    """Execute ``body`` as a module registered under ``name`` (msgspec and
    dataclasses resolve postponed annotations through ``sys.modules``)."""
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module
    code = compile(ast.Module(body=body, type_ignores=[]), filename, "exec")
    exec(code, module.__dict__)
    return module


@cache
def errors_030() -> types.ModuleType:
    """0.30's ``vllm_omni/errors.py``, executed as ``vllm_omni_030.errors``."""
    tree = parse("errors.py")
    return _module("vllm_omni_030.errors", tree.body, str(tree_030() / "errors.py"))


@cache
def messages_030() -> types.ModuleType:
    """0.30's ``EngineQueueMessage`` and ``ErrorMessage`` Structs (strict:
    ``forbid_unknown_fields=True``), executed as ``vllm_omni_030.messages``."""
    tree = parse("engine/messages.py")
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module in _STRUCT_IMPORTS:
            body.append(node)
        elif isinstance(node, ast.Import) and all(
            alias.name in _STRUCT_IMPORTS for alias in node.names
        ):
            body.append(node)
        elif isinstance(node, ast.ClassDef) and node.name in _STRUCTS:
            body.append(node)
    found = {n.name for n in body if isinstance(n, ast.ClassDef)}
    assert found == set(_STRUCTS), f"0.30 messages.py lacks {set(_STRUCTS) - found}"
    path = str(tree_030() / "engine/messages.py")
    return _module("vllm_omni_030.messages", body, path)


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"0.30 has no class {name}")


def function_030(
    relative: str, class_name: str, name: str, namespace: Mapping[str, Any]
) -> Callable[..., Any]:
    """Method ``class_name.name`` of a 0.30 file, as a plain function.

    Decorators are dropped (a classmethod is called with its ``cls``);
    annotations stay unevaluated; free names resolve in ``namespace``.
    """
    tree = parse(relative)
    for node in _class(tree, class_name).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
            node.name == name
        ):
            node.decorator_list = []
            future = ast.ImportFrom("__future__", [ast.alias("annotations")], 0)
            module = ast.fix_missing_locations(ast.Module([future, node], []))
            scope = dict(namespace)
            exec(compile(module, str(tree_030() / relative), "exec"), scope)
            function: Callable[..., Any] = scope[name]
            return function
    raise AssertionError(f"0.30 {class_name} has no method {name}")


def class_030(relative: str, name: str, namespace: Mapping[str, Any]) -> type:
    """Class ``name`` of a 0.30 file, executed with its free names (its
    bases included) resolved in ``namespace``."""
    node = _class(parse(relative), name)
    future = ast.ImportFrom("__future__", [ast.alias("annotations")], 0)
    module = ast.fix_missing_locations(ast.Module([future, node], []))
    scope = {"__name__": f"vllm_omni_030.{Path(relative).stem}", **namespace}
    exec(compile(module, str(tree_030() / relative), "exec"), scope)
    made: type = scope[name]
    return made


def methods_030(relative: str, class_name: str) -> Iterator[ast.FunctionDef]:
    """The method definitions of a 0.30 class."""
    for node in _class(parse(relative), class_name).body:
        if isinstance(node, ast.FunctionDef):
            yield node


def fields_030(relative: str, class_name: str) -> list[str]:
    """The annotated fields of a 0.30 dataclass, in order."""
    return [
        node.target.id
        for node in _class(parse(relative), class_name).body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    ]


def dict_expressions(relative: str, **items: object) -> list[ast.Dict]:
    """Dict displays of a 0.30 file whose constant keys map to ``items``
    (``type="error"``: every ``{"type": "error", ...}`` it builds)."""
    found = []
    for node in ast.walk(parse(relative)):
        if not isinstance(node, ast.Dict):
            continue
        constants = {
            key.value: value.value
            for key, value in zip(node.keys, node.values, strict=True)
            if isinstance(key, ast.Constant) and isinstance(value, ast.Constant)
        }
        if all(constants.get(k, object()) == v for k, v in items.items()):
            found.append(node)
    return found


def evaluate(relative: str, node: ast.expr, namespace: Mapping[str, Any]) -> Any:
    """Evaluate one expression cut out of a 0.30 file in ``namespace``."""
    expression = ast.fix_missing_locations(ast.Expression(node))
    return eval(
        compile(expression, str(tree_030() / relative), "eval"), dict(namespace)
    )


def free_names(node: ast.AST) -> set[str]:
    """The names an expression reads (what its namespace must provide)."""
    return {
        n.id
        for n in ast.walk(node)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }
