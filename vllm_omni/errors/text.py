"""Client text that is not Unicode: where it is, and how to make it safe (§10).

JSON allows the escape ``"\\ud800"``, and ``json.loads`` decodes UTF-8 or
UTF-16 bytes with ``surrogatepass``; a multipart part declared in a codec
such as UTF-7 decodes the same way. Each gives Python a ``str`` holding a
lone surrogate (a high or low half alone, or a reversed pair): a string that
no UTF-8 encoder accepts, so msgspec on the stage wire, SQLite, a JSON
response, a WebSocket text frame or a log handler would raise on it.

This module owns the one test for such text and the two things done with it:
``non_unicode_field`` finds the first such string (value or key) in a parsed
request and names its field, so the boundary refuses it with a 400 naming
that field; ``make_safe`` replaces lone surrogates by U+FFFD where text must
be shown anyway (an error message that quotes a model name, a log line). It
imports nothing but ``re``, so the sanitizer, the stage wire's checks and the
HTTP boundary can all use it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["NonUnicode", "is_unicode", "make_safe", "non_unicode_field"]

# A Python str never holds a valid surrogate pair (the decoder joins it into
# one code point), so any surrogate code point is one that is alone.
_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def is_unicode(text: str) -> bool:
    """True unless ``text`` holds a lone surrogate."""
    # isascii() reads a flag CPython keeps on the string: most text is done.
    return text.isascii() or _SURROGATE.search(text) is None


def make_safe(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD."""
    return text if text.isascii() else _SURROGATE.sub(REPLACEMENT, text)


@dataclass(frozen=True, slots=True)
class NonUnicode:
    """Where a request holds text that is not Unicode.

    ``path`` is the field (``messages.0.content``: keys and list indices
    joined by dots, as request validation names fields); for a field *name*
    that is not Unicode it is the object holding it (``""`` for the top
    level), and ``in_name`` is set.
    """

    path: str
    in_name: bool = False


def non_unicode_field(value: object, path: str = "") -> NonUnicode | None:
    """The first string in ``value`` (a parsed JSON document: dicts, lists,
    strings, numbers) that is not Unicode, or ``None``.

    Iterative, so a document nested as deep as the JSON decoder allows cannot
    exhaust the interpreter's recursion limit here.
    """
    stack: list[tuple[object, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if not is_unicode(item):
                return NonUnicode(where)
        elif isinstance(item, Mapping):
            children = []
            for key, child in item.items():
                if isinstance(key, str) and not is_unicode(key):
                    return NonUnicode(where, in_name=True)
                children.append((child, _join(where, key)))
            # Reversed onto the stack, so fields are checked in document order.
            stack.extend(reversed(children))
        elif isinstance(item, list | tuple):
            stack.extend(
                (child, _join(where, index))
                for index, child in reversed(list(enumerate(item)))
            )
    return None


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)
