"""The prefilter cannot skip its own rules (issue 40).

A rule runs on a text only when one of its trigger strings occurs in it
(``sanitize._TRIGGERS``); a trigger list that disagrees with its pattern
skips the rule silently, as ``vendor_token``'s did for GitHub fine-grained
tokens (``github_pat_`` holds no ``gh``). For every rule of the table, our
own and detect-secrets' alike, hypothesis draws matches of the rule's own
pattern and the prefilter must admit the rule for each one; the credential
rules' own prefilter (log lines) admits the same credential rules.
"""

from __future__ import annotations

import re
from re import _constants, _parser  # type: ignore[attr-defined]
from typing import Any

import pytest
from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_omni.errors import sanitize
from vllm_omni.errors.sanitize import redact_credentials, sanitize_message

TABLE = sanitize._table()
CREDENTIALS = frozenset(TABLE.credentials)


def _lookbehind(parsed: Any) -> int:
    """The widest lookbehind in a parsed pattern: how far before a match the
    text the rule needs may begin (``url_userinfo`` follows ``://``, its
    trigger)."""
    widest = 0
    for op, arg in parsed:
        if op is _constants.ASSERT and arg[0] == -1:
            widest = max(widest, arg[1].getwidth()[1])
        for item in arg if isinstance(arg, (tuple, list)) else ():
            for sub in item if isinstance(item, list) else (item,):
                if isinstance(sub, _parser.SubPattern):
                    widest = max(widest, _lookbehind(sub))
    return widest


def _before(name: str) -> int:
    return _lookbehind(_parser.parse(TABLE.patterns[name]))


def test_lookbehinds_are_seen() -> None:
    assert _before("url_userinfo") == len("://")
    assert _before("jwt") == 0


def _alternatives() -> list[tuple[str, str]]:
    """(rule, pattern to draw from): each rule's pattern, and each part of a
    rule built by joining parts (a vendor prefix, a detect-secrets pattern),
    which hypothesis would otherwise draw too rarely to check them all."""
    plugins = {
        f"ds_{cls.__name__}": cls
        for cls in get_mapping_from_secret_type_to_class().values()
    }
    drawn = [(name, TABLE.patterns[name]) for name in TABLE.every]
    drawn += [
        ("vendor_token", rf"\b{re.escape(prefix)}{body}")
        for prefix, body in sanitize._VENDOR_PREFIXES
    ]
    drawn += [
        (name, sanitize._inline(part))
        for name in TABLE.every
        if name in plugins
        for part in plugins[name]().denylist
    ]
    return drawn


# Texts around a part of a log line: words, separators, and letters whose
# lower case depends on what follows (a final sigma) or is not one letter.
_AROUND = [("", "x"), ("x", ""), ("token ", "="), ("ΑΣ", "Σα"), ("İ", "K"), ("_", "-")]


def _assertions(parsed: Any) -> list[Any]:
    """The anchors, boundaries and lookarounds of a parsed pattern."""
    found = []
    for op, arg in parsed:
        if op in (_constants.AT, _constants.ASSERT, _constants.ASSERT_NOT):
            found.append((op, arg))
        for item in arg if isinstance(arg, (tuple, list)) else ():
            for sub in item if isinstance(item, list) else (item,):
                if isinstance(sub, _parser.SubPattern):
                    found += _assertions(sub)
    return found


def test_the_credential_triggers_occur_in_any_text_around_them() -> None:
    """A credential trigger that is a pattern has no anchor, boundary or
    lookaround: what it finds in a part of a text it finds in the text."""
    triggers = TABLE.triggered_credentials
    patterns = [pattern for pattern, _ in triggers._patterns]
    patterns += [pattern for parts, _ in triggers._every for _, pattern, _ in parts]
    assert patterns, "the credential triggers have patterns"
    for pattern in patterns:
        assert not _assertions(_parser.parse(pattern.pattern)), pattern.pattern


@pytest.mark.parametrize(("name", "drawn"), _alternatives())
def test_the_prefilter_admits_every_match_of_every_rule(name: str, drawn: str) -> None:
    rule = re.compile(TABLE.patterns[name])
    before = _before(name)

    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.from_regex(drawn))
    def admitted(text: str) -> None:
        match = rule.search(text)
        if match is None:  # a lookaround the draw did not honour
            return
        needed = text[max(0, match.start() - before) : match.end()]
        assert name in TABLE.triggered.rules(needed), needed
        # A log line is scanned with the credential rules' triggers alone:
        # they admit exactly the credential rules the whole set admits.
        assert TABLE.triggered_credentials.rules(text) == (
            TABLE.triggered.rules(text) & CREDENTIALS
        ), text
        # A trigger that occurs in a text occurs in any text around it
        # (``may_hold_credentials`` relies on it for a log line's parts).
        found = TABLE.triggered_credentials.rules(text)
        for before_text, after_text in _AROUND:
            around = before_text + text + after_text
            assert found <= TABLE.triggered_credentials.rules(around), around

    admitted()


def test_the_vendor_rule_is_triggered_by_each_prefix_it_matches() -> None:
    """The vendor rule's triggers are its prefixes, not a list beside them."""
    assert TABLE.triggers["vendor_token"] == tuple(
        prefix for prefix, _ in sanitize._VENDOR_PREFIXES
    )


# A GitHub fine-grained token as GitHub issues it: ``github_pat_``, 22
# characters, ``_`` and 59 more, none of them making a "gh" the old trigger
# needed (and no run long enough for the base64 rule to take it instead).
GITHUB_PAT = (
    "github_pat_11ABCDE2Q0xY7kLm3NpQ9r_StUvWz1AxY7kLm3NpQ9rStUvWz1AxY7kLm3NpQ9r"
    "StUvWz1AxY7kLm3NpQ9"
)
HEX_TOKEN = "9f3a1c7e5b2d4f60"


def test_the_planted_classes_have_their_published_shape() -> None:
    assert len(GITHUB_PAT) == len("github_pat_") + 82
    assert "gh" not in GITHUB_PAT.removeprefix("github_pat_").lower()
    assert re.fullmatch(r"[0-9a-f]{16}", HEX_TOKEN)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f"Bad credentials for {GITHUB_PAT} (401)",
            "Bad credentials for <redacted> (401)",
        ),
        (f"token: {HEX_TOKEN}", "token: <redacted>"),
        (f"upstream refused token: {HEX_TOKEN}, retry", None),
        (f"key: {HEX_TOKEN}{HEX_TOKEN}", "key: <redacted>"),
        (f"HF token: hf_{HEX_TOKEN}XYZ", "HF token: <redacted>"),
        (f"secret: '{HEX_TOKEN}Ab'", "secret: <redacted>"),
        (
            "sig: Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5 expired",
            "sig: <redacted> expired",
        ),
        ("token: 5f9c2b1e-7a4d-4c1e-9b2f-3d8e6a1c0f4b", "token: <redacted>"),
    ],
)
def test_both_leaked_classes_are_redacted(text: str, expected: str | None) -> None:
    for function in (sanitize_message, redact_credentials):
        out = function(text)
        assert GITHUB_PAT not in out and HEX_TOKEN not in out, out
        if expected is not None:
            assert out == expected
        assert "<redacted>" in out


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.lists(st.text("ab:/-_x", min_size=1, max_size=5), min_size=1, max_size=8),
    st.text("ab:/-_xy", max_size=30),
)
def test_the_trie_finds_any_literal_exactly(literals: list[str], text: str) -> None:
    """The prefilter's one scan for any trigger, built as a trie, finds one
    exactly when one of the literals occurs."""
    found = re.search(sanitize._any_of(literals), text) is not None
    assert found == any(literal in text for literal in literals)
