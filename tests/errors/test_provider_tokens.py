"""The sanitizer against providers' published token formats (issue 40).

The corpus (``provider_tokens.py``) comes from no rule the sanitizer
compiles, so a provider the rules lack or a trigger that skips a rule shows
up here as a leak; recall must be 100 % in public messages and log lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.errors import provider_tokens
from tests.errors.provider_tokens import TokenCase, provider_corpus
from vllm_omni.errors.sanitize import redact_credentials, sanitize_message

CORPUS = provider_corpus()


def test_the_corpus_owes_nothing_to_the_rules_it_checks() -> None:
    tree = ast.parse(Path(provider_tokens.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert imported <= {
        "__future__",
        "dataclasses",
        "functools",
        "hypothesis",
        "random",
    }


def test_every_format_contributes() -> None:
    sources = {case.source for case in CORPUS}
    assert {name for name, _ in provider_tokens.PROVIDER_FORMATS} <= sources
    assert len(CORPUS) >= 250


@pytest.mark.parametrize("source", sorted({case.source for case in CORPUS}))
def test_recall_is_complete_in_messages_and_logs(source: str) -> None:
    cases: list[TokenCase] = [case for case in CORPUS if case.source == source]
    for redact in (sanitize_message, redact_credentials):
        leaks = [case.text for case in cases if case.token in redact(case.text)]
        assert leaks == [], redact.__name__
