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
    # Otherwise the UTF-8 encoder is the test itself, and about four times
    # faster than a regex search for a surrogate.
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def make_safe(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD."""
    return text if is_unicode(text) else _SURROGATE.sub(REPLACEMENT, text)


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
    """A string in ``value`` (a parsed JSON document: dicts, lists, strings,
    numbers) that is not Unicode, value or key, or ``None``.

    Strings are checked where they stand; only containers are queued, and
    the path is built for the one string found. Iterative, so a document
    nested as deep as the JSON decoder allows cannot exhaust the
    interpreter's recursion limit here.
    """
    if isinstance(value, str):
        return None if is_unicode(value) else NonUnicode(path)
    if not isinstance(value, Mapping | list | tuple):
        return None
    # (parent, key) of every queued container; index 0 is ``value`` itself.
    nodes: list[tuple[int, object]] = [(-1, path)]
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, node = stack.pop()
        children = item.items() if isinstance(item, Mapping) else enumerate(item)  # type: ignore[call-overload]
        for key, child in children:
            if isinstance(key, str) and not is_unicode(key):
                return NonUnicode(_path(nodes, node), in_name=True)
            if isinstance(child, str):
                if not is_unicode(child):
                    return NonUnicode(_join(_path(nodes, node), key))
            elif isinstance(child, Mapping | list | tuple):
                nodes.append((node, key))
                stack.append((child, len(nodes) - 1))
    return None


def _path(nodes: list[tuple[int, object]], node: int) -> str:
    parts = []
    while node > 0:
        node, key = nodes[node]
        parts.append(str(key))
    root = str(nodes[0][1])
    return ".".join(([root] if root else []) + parts[::-1])


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)
