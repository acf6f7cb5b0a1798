"""The audit's name tables agree with the runtime's, where both are installed.

The audit keeps its own copy of the exception names it needs (``rules``: it
runs without vLLM or vllm-omni installed, and ``vllm_omni.errors.table``
imports vLLM). Here each copy is checked against the classes and the status
table it mirrors: the semantic and client types, their parents, the type
suggested for a status or a raw raise, and the names ``--fix`` imports from
``vllm_omni.errors``. Skipped only where vllm_omni is not installed.
"""

from __future__ import annotations

import builtins
import importlib
from types import ModuleType

import pytest

from vllm_omni_errors_audit import rules

pytest.importorskip(
    "vllm_omni",
    reason="vllm_omni is not installed: no runtime table to compare with",
    exc_type=ModuleNotFoundError,
)


@pytest.fixture(scope="module")
def errors() -> ModuleType:
    return importlib.import_module(rules.ERRORS_MODULE)


@pytest.fixture(scope="module")
def table() -> ModuleType:
    return importlib.import_module("vllm_omni.errors.table")


def _class(errors: ModuleType, name: str) -> type[BaseException]:
    """A type by name: re-exported by ``vllm_omni.errors``, else upstream's."""
    found = getattr(errors, name, None)
    if found is None:
        found = getattr(importlib.import_module("vllm.exceptions"), name)
    return found


def test_every_row_of_the_status_table_is_a_semantic_type(table: ModuleType) -> None:
    rows = [
        r for r in table.STATUS_TABLE if r.exc_type not in (Exception, BaseException)
    ]
    named = {r.exc_type.__name__ for r in rows}
    assert named - rules.SEMANTIC_TYPES == set()
    client = {r.exc_type.__name__ for r in rows if r.category == "client"}
    assert client - rules.CLIENT_ERROR_TYPES == set()


def test_every_semantic_type_is_one_with_the_category_the_audit_gives_it(
    errors: ModuleType, table: ModuleType
) -> None:
    for name in sorted(rules.SEMANTIC_TYPES):
        cls = _class(errors, name)
        assert issubclass(cls, errors.VLLMError), name
        category = table.row_for(cls).category
        assert (category == "client") == (name in rules.CLIENT_ERROR_TYPES), name


def test_each_parent_is_the_nearest_the_audit_knows(errors: ModuleType) -> None:
    known = {*rules.SEMANTIC_PARENTS, "Exception"}
    for name, parent in rules.SEMANTIC_PARENTS.items():
        mro = [c.__name__ for c in _class(errors, name).__mro__[1:]]
        assert next(n for n in mro if n in known) == parent, name


def test_the_type_suggested_for_a_status_has_that_status(
    errors: ModuleType, table: ModuleType
) -> None:
    for status, name in rules.SUGGESTION_BY_STATUS.items():
        assert table.row_for(getattr(errors, name)).status_code == status, name
    for category, name in rules.EXPLICIT_STATUS_TYPES.items():
        row = table.row_for(getattr(errors, name))
        assert (row.category, row.status_attr) == (category, "status_code"), name
        assert row.status_code in rules.RECORD_CATEGORIES[category], name


def test_raw_raises_are_the_runtime_legacy_fallbacks(
    errors: ModuleType, table: ModuleType
) -> None:
    # The builtins the runtime maps to 4xx/501 only in legacy mode are the
    # raises the audit reports as raw (OMNI001).
    raw = {
        name
        for name, value in vars(builtins).items()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and table.row_for(value, legacy=True).legacy_fallback
    }
    assert raw == set(rules.RAW_RAISE_SUGGESTIONS)
    # For the fallbacks' own types, the suggestion keeps the status.
    for row in table.LEGACY_FALLBACKS:
        suggested = getattr(errors, rules.RAW_RAISE_SUGGESTIONS[row.exc_type.__name__])
        assert table.row_for(suggested).status_code == row.status_code, row


def test_fix_imports_only_names_vllm_omni_errors_exports(errors: ModuleType) -> None:
    names = {
        rules.FIX_BASE,
        rules.RECORD_TYPE,
        *rules.SUGGESTION_BY_STATUS.values(),
        *rules.RAW_RAISE_SUGGESTIONS.values(),
        *(suggestion for _, suggestion, _ in rules.MESSAGE_HINTS),
        *rules.EXPLICIT_STATUS_TYPES.values(),
        *rules.SEMANTIC_PARENTS,
        *rules.PARAMETER_TYPES,
    }
    assert sorted(n for n in names if not hasattr(errors, n)) == []
    for name in rules.PARAMETER_TYPES:
        assert getattr(errors, name)("m", parameter="field").parameter == "field"
