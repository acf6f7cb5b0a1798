"""Inside the OpenAI server, imports run one way (docs/design.md §1): the
request models and the OpenAPI document below the serving modules, the
serving modules below the thin routes, the app above them all.

Read with ``tests/import_graph.py``: imports inside functions and modules
loaded by name count too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_graph import import_graph

ROOT = Path(__file__).resolve().parents[3]
OPENAI = "vllm_omni.entrypoints.openai"


def _in(module: str, name: str) -> bool:
    return module == f"{OPENAI}.{name}" or module.startswith(f"{OPENAI}.{name}.")


def _route(module: str) -> bool:
    return _in(module, "routes")


def _serving(module: str) -> bool:
    return module.startswith(f"{OPENAI}.serving_")


# Who may not import what: the importer's test, the imported's test.
RULES = {
    "only the app imports a route": (
        lambda m: not _route(m) and m != f"{OPENAI}.api_server",
        _route,
    ),
    "a serving module imports no route": (_serving, _route),
    "the request models import no serving module": (
        lambda m: _in(m, "protocol"),
        lambda m: _serving(m) or _in(m, "openapi"),
    ),
    "the OpenAPI document imports no serving module": (
        lambda m: _in(m, "openapi"),
        _serving,
    ),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_imports_run_one_way(rule: str) -> None:
    graph = import_graph(ROOT, "vllm_omni")
    importer_is, imported_is = RULES[rule]
    assert any(_route(m) for m in graph), "the routes were not found"
    wrong = [
        f"{importer} imports {imported}"
        for importer, targets in sorted(graph.items())
        for imported in sorted(targets)
        if importer.startswith(OPENAI)
        and importer_is(importer)
        and imported_is(imported)
    ]
    assert wrong == []
