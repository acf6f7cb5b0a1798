"""A secrets corpus generated from a maintained rule set: detect-secrets.

Shared by ``test_secret_rules.py`` (recall must be 100 %) and
``benchmarks/bench_sanitize.py`` (recall before and after the rule set was
added to the sanitizer). Nothing here is written from memory:

- every regex plugin of detect-secrets contributes strings drawn from each
  of its own patterns (hypothesis ``from_regex``, derandomized, so the
  corpus is the same on every run), set in realistic surroundings; the JWT
  plugin also requires its first two parts to decode to JSON, so its tokens
  are drawn as JSON and encoded;
- its keyword plugin contributes ``name: value`` forms for every name on its
  list, in the forms its own patterns read in config files and in code.

Each case keeps only what detect-secrets itself reports in the text (its
plugins' ``analyze_string``, never ``analyze_line``, which may try to verify
a secret over the network): those values must be gone after sanitizing. A
plugin whose pattern captures a group at the very start of its match
(GitHub's prefix) reports only that group; there, the whole token must go.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import string
from dataclasses import dataclass

from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
from detect_secrets.plugins.base import BasePlugin, RegexBasedDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.keyword import (
    DENYLIST,
    REGEX_BY_FILETYPE,
    KeywordDetector,
)
from detect_secrets.util.filetype import FileType
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

__all__ = ["LEFT_OUT", "RuleCase", "rule_corpus"]

# Plugins that are not about credentials, and are left out of the corpus as
# they are of the sanitizer: a request id, a hash or an address must stay.
LEFT_OUT = frozenset(
    {"Base64HighEntropyString", "HexHighEntropyString", "IPPublicDetector"}
)

CONTEXTS = (
    "{}",
    "failed to load credentials {} from the environment",
    "could not connect to the stage: {}",
    "ValueError: unexpected field in request {} expected messages",
)
# (form, file the keyword plugin reads it in): config files and code.
KEYWORD_FORMS = (
    ("{name}: {value}", FileType.YAML),
    ("{name} = {value}", FileType.INI),
    ('{name} = "{value}"', FileType.PYTHON),
    ('"{name}": "{value}"', FileType.JAVASCRIPT),
    ("{name}={value}", FileType.PROPERTIES),
)
_DELIMITERS = " \t\r\n\v\f\"'`=:@[]()"


@dataclass(frozen=True)
class RuleCase:
    """One text; every value in ``secrets`` must be gone after sanitizing."""

    plugin: str
    text: str
    secrets: tuple[str, ...]


def _draws(strategy: st.SearchStrategy[str], count: int) -> list[str]:
    drawn: list[str] = []

    @settings(
        derandomize=True,
        database=None,
        max_examples=count,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def draw(text: str) -> None:
        drawn.append(text)

    draw()
    return drawn


def _segment(value: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


# The JWT plugin keeps a match of its pattern only when its first two parts
# decode to JSON: draw the JSON, then encode it as the pattern reads it.
_JSON_OBJECTS = st.dictionaries(
    st.text(string.ascii_letters, min_size=1, max_size=8),
    st.one_of(st.integers(), st.text(string.printable, max_size=12)),
    max_size=3,
)
_JWT = st.builds(
    lambda header, payload, signature: (
        f"{_segment(header)}.{_segment(payload)}.{signature}"
    ),
    _JSON_OBJECTS.map(lambda extra: {"alg": "HS256", **extra}),
    _JSON_OBJECTS,
    st.from_regex(r"[A-Za-z0-9_-]{16,43}", fullmatch=True),
)


def _reported(plugin: BasePlugin, text: str, **kwargs: object) -> tuple[str, ...]:
    return tuple(sorted({value for value in plugin.analyze_string(text, **kwargs)}))


def _whole(pattern: re.Pattern[str], text: str) -> tuple[str, ...]:
    """The whole token, when the pattern's first group starts its match."""
    match = pattern.search(text)
    if match is None or (match.re.groups and match.start(1) != match.start()):
        return ()
    return (match.group().strip(_DELIMITERS),)


def _regex_cases(plugin: RegexBasedDetector, count: int) -> list[RuleCase]:
    cases = []
    for pattern in plugin.denylist:
        strategy = _JWT if isinstance(plugin, JwtTokenDetector) else None
        drawn_texts = _draws(strategy or st.from_regex(pattern, fullmatch=True), count)
        for index, drawn in enumerate(drawn_texts):
            text = CONTEXTS[index % len(CONTEXTS)].format(drawn)
            reported = _reported(plugin, text)
            if reported:
                secrets = {*reported, *_whole(pattern, text)} - {""}
                cases.append(
                    RuleCase(type(plugin).__name__, text, tuple(sorted(secrets)))
                )
    return cases


def _names() -> list[str]:
    """Every name on the keyword plugin's list, each optional ``_`` both ways,
    bare and as a word of a longer identifier."""
    names = []
    for entry in DENYLIST:
        for spelling in {entry.replace("_?", ""), entry.replace("_?", "_")}:
            names += [spelling, f"db_{spelling}", f"{spelling.upper()}_value"]
    return names


def _keyword_cases() -> list[RuleCase]:
    plugin = KeywordDetector()
    values = ("Zx81aaBB", "hunter2-long", "s3cr3t.v4l/ue", "4f9c2b1e7a4d")
    cases = []
    for index, name in enumerate(_names()):
        for form, filetype in KEYWORD_FORMS:
            value = values[index % len(values)]
            line = form.format(name=name, value=value)
            text = CONTEXTS[index % len(CONTEXTS)].format(line)
            reported = _reported(
                plugin, text, denylist_regex_to_group=REGEX_BY_FILETYPE[filetype]
            )
            if reported:
                cases.append(RuleCase("KeywordDetector", text, reported))
    return cases


def plugins() -> list[type[BasePlugin]]:
    """detect-secrets' plugins that find credentials, by class name."""
    found = get_mapping_from_secret_type_to_class().values()
    return sorted(
        (cls for cls in found if cls.__name__ not in LEFT_OUT),
        key=lambda cls: cls.__name__,
    )


@functools.cache
def rule_corpus(per_pattern: int = 12) -> tuple[RuleCase, ...]:
    """The corpus: ``per_pattern`` draws of every regex plugin's patterns,
    and the keyword plugin's names in every form."""
    cases: list[RuleCase] = []
    for cls in plugins():
        if issubclass(cls, RegexBasedDetector):
            cases += _regex_cases(cls(), per_pattern)
    cases += _keyword_cases()
    return tuple(cases)
