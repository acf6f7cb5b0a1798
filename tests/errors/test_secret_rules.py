"""The sanitizer against a maintained rule set: detect-secrets (issue 24).

The corpus (``secret_rules.py``) is generated from detect-secrets' own
plugins; recall must be 100 % in public messages and in log lines, while
the benign corpus stays byte-identical (``test_sanitize.py``). The rule set
is wired in completely: every plugin that finds credentials is either a rule
of the table or stated as left out, and the cheap triggers chosen for each
plugin's rule are necessary (every corpus text of a plugin trips one).
"""

from __future__ import annotations

import pytest
from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.keyword import DENYLIST

from tests.errors.secret_rules import LEFT_OUT, RuleCase, plugins, rule_corpus
from vllm_omni.errors import sanitize
from vllm_omni.errors.sanitize import redact_credentials, sanitize_message

CORPUS = rule_corpus()


def _leaks(function: object, cases: tuple[RuleCase, ...]) -> list[tuple[str, str]]:
    return [
        (case.text, secret)
        for case in cases
        for secret in case.secrets
        if secret in function(case.text)  # type: ignore[operator]
    ]


def test_every_credential_plugin_contributes_to_the_corpus() -> None:
    assert {case.plugin for case in CORPUS} == {cls.__name__ for cls in plugins()}
    assert len(CORPUS) > 800


@pytest.mark.parametrize("plugin", sorted({case.plugin for case in CORPUS}))
def test_recall_is_complete_in_messages_and_logs(plugin: str) -> None:
    cases = tuple(case for case in CORPUS if case.plugin == plugin)
    assert _leaks(sanitize_message, cases) == []
    assert _leaks(redact_credentials, cases) == []


def test_the_rules_alone_missed_about_half() -> None:
    """The corpus is not one our own rules already passed: without the rule
    set they leave about half of its secrets (the "before" of the benchmark)."""
    before = sanitize._table(rule_set=False)

    def ours_alone(text: str) -> str:
        return sanitize._fixed_point(text, table=before)

    secrets = sum(len(case.secrets) for case in CORPUS)
    assert 0.3 * secrets < len(_leaks(ours_alone, CORPUS)) < 0.7 * secrets


def test_every_plugin_is_a_rule_or_left_out_for_a_reason() -> None:
    table = sanitize._table()
    rules = {name.removeprefix("ds_") for name in table.every if name[:3] == "ds_"}
    regex_plugins = {
        cls.__name__
        for cls in get_mapping_from_secret_type_to_class().values()
        if issubclass(cls, RegexBasedDetector)
    }
    assert rules == regex_plugins - sanitize._SKIPPED_PLUGINS
    # Left out of the sanitizer: not credentials (as in the corpus), or
    # covered by our own URL rule (which the corpus checks).
    assert sanitize._SKIPPED_PLUGINS == LEFT_OUT | {"BasicAuthDetector"}
    # Every rule has triggers chosen for it (a plugin added by an upgrade
    # would fall back to its own pattern: exact, but a scan per message).
    assert rules <= set(sanitize._PLUGIN_TRIGGERS)
    # The keyword plugin's names are ours too, and each is triggered.
    for name in DENYLIST:
        assert name in table.patterns["assignment"]
        assert any(w in name.replace("_?", "") for w in sanitize._SECRET_NAME.words)


def test_chosen_triggers_are_necessary() -> None:
    table = sanitize._table()
    for case in CORPUS:
        rule = f"ds_{case.plugin}"
        if rule in table.triggers:
            assert rule in table.triggered.rules(case.text), case


def test_a_plugin_match_keeps_its_context() -> None:
    """A plugin whose pattern includes a keyword redacts the secret only."""
    key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    assert (
        sanitize_message(f"aws secret key is '{key}' here")
        == "aws secret key is '<redacted>' here"
    )
    assert sanitize_message("token sq0csp-" + "a" * 43 + " expired") == (
        "token <redacted> expired"
    )
