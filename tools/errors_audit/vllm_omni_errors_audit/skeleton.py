"""A file's skeleton: every statement nothing can be found in becomes ``pass``.

Owns the cheap step before parsing. Parsing is most of a cold audit's cost
and most statements of a file (assignments, calls, docstrings, whole
functions) can neither hold a finding nor change one.

The fast path is the C lexer (``_lexer.c``, an optional extension built with
the package): one pass finds the lines holding a hot needle, a ``;``, or
``global``/``nonlocal`` (``needle_lines``), a second splits the text into
logical lines exactly as CPython's tokenizer does and replaces the body of
every function with none of those lines by one ``pass`` row
(``logical_lines``; ``_fast_cut`` makes the same cut in the lines). Where it
does not follow a text exactly it declines, and so does an install without
it: then the body of every function with no hot line, no
``global``/``nonlocal`` and balanced bracket counts is replaced by one
``pass`` found by indentation with ``str.find`` and regular expressions
(``_cut_cold_bodies``: about 40% of the lines of vLLM 0.33, which the
tokenizer then never sees). Such a ``pass`` is always replaced again below
(it is never kept) unless the cut was not a body (a ``def`` inside a
string): then it stays inside a kept statement, the scanner's check finds
no ``pass`` there, and the file is parsed whole. On what is left, CPython's
own tokenizer (the C one the parser uses, so logical lines, strings and
brackets are split exactly as the parser splits them, in about a quarter of
a parse's time) finds each logical line and its block depth.

Either way, a statement is then *kept* when one of its lines holds a hot
substring (``scanner._HOT_STATEMENT``: the trigger tokens and ``import``),
when it binds a name (an import, a class, a possible alias ``N = a.b`` or
``N = (a, b)``, a ``;`` line with an ``=``), or when it is the first
statement of a file with ``from __future__``. (``_replaceable_runs`` below
also has a C twin, ``_lexer.replaceable_runs``, used where it is built; the
Python one is its specification.) Every stretch of
whole statements of one block that are not kept - a compound statement with
its block and clauses, a definition with its decorators - is replaced by
one ``pass`` on its first line at its indentation, the rest of its lines
blanked; so is the block of a kept header when none of it is kept. A
``def`` header that stays but has no hot token becomes ``def name():`` (the
scanner reads a function's name and its decorators, which are their own
lines). Every other kept line is unchanged, so every node the scanner reads
has the same line and column as in the whole file.

A replaced statement cannot matter to the scanner: raises need ``raise``;
OMNI002/OMNI003 returns and the expression rules need a trigger token or a
local alias of one (the scanner looks for those aliases on the blanked lines
afterwards and parses the file whole if one is there); names are bound only
by statements that are kept. The scanner also checks that every ``pass``
landed where it was put.

What a skeleton hides is a syntax error, or nesting too deep for the
parser, inside a replaced statement (the tokenizer still rejects bad tokens,
brackets, strings and indentation, and the parser still checks the kept
statements): such a file is audited instead of being an OMNI000 finding,
the same trade the trigger prefilter makes for whole files.

``_tokenize.TokenizerIter`` is CPython 3.11's private binding of that
tokenizer; where it is missing or behaves differently, there is no skeleton
and the file is parsed whole (slower, same results).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

try:
    from _tokenize import TokenizerIter
except ImportError:  # not CPython 3.11-compatible: always parse whole files
    TokenizerIter = None
try:
    from vllm_omni_errors_audit import _lexer
except ImportError:  # built without a C compiler: CPython's tokenizer only
    _lexer = None

_NEWLINE, _INDENT, _DEDENT = 4, 5, 6
# Clauses continue the compound statement before them: a stretch never
# starts at one, nor ends just before one.
_CLAUSES = frozenset({"elif", "else", "except", "finally", "case"})
# Statements that bind names (imports, classes, ``(E) = X``) are never
# dropped, even inside a block that is otherwise replaced.
_BINDING_FIRST = frozenset({"import", "from", "class", "("})
# ``N = <value>`` may bind an alias when the value is a name, an attribute
# chain or a tuple of them: only names, dots, commas, parentheses (not a
# call's) and line continuations, and at least one letter.
_ALIAS_VALUE = re.compile(r"[\s\w.,()\\]*\Z")
_CALL = re.compile(r"[\w)]\s*\(")
# Short substrings shared by several hot needles (``VLLMValidationError``,
# ``OmniClientError``, ... all contain ``Error``; the status bounds ``00`` or
# ``99``): one search each instead of one per needle.
_PROBES = ("Error", "00", "99", "HTTP", "_error")
# An integer literal that is not plain decimal: hexadecimal, octal, binary,
# or with underscores (also matches names such as ``conv1_out``: kept).
_OTHER_INTEGER = re.compile(r"\d[xXoObB_]")
_LETTER = re.compile(r"[A-Za-z_]")
# A value with one of these is an expression or a constant, never a name.
_NOT_A_NAME = re.compile(
    r"\b(?:if|else|and|or|not|is|in|for|lambda|await|yield|None|True|False)\b"
)


# The first line of a body: not blank, not only a comment.
_BODY_LINE = re.compile(r"\n( *)(?=[^ \n#])")
# A header's last line: ``:`` at its end, or before a comment.
_HEADER_END = re.compile(r":[ \t]*(?:#[^\n]*)?$")
_BRACKETS = (("(", ")"), ("[", "]"), ("{", "}"))
# A body with one of these binds names outside itself: never cut.
_SCOPE_WORDS = ("global", "nonlocal")


@dataclass(frozen=True, slots=True)
class Skeleton:
    """The source to parse instead, and where its ``pass`` statements are."""

    source: str
    # (line, column) of each ``pass`` that replaced a statement; column in
    # UTF-8 bytes, as the ``ast`` reports it.
    replaced: list[tuple[int, int]]
    # 1-based numbers of every line that was replaced or blanked.
    blanked: frozenset[int]
    # The ``hot`` substrings that occur in the text (anywhere).
    found: frozenset[str]
    # (line, column) of each ``def`` header cut down to ``def name():``.
    headers: list[tuple[int, int]]
    # The text's own lines (split at ``\n``, the only line break a
    # skeleton's text has), for the scanner's columns and code excerpts.
    lines: list[str]


def skeleton(text: str, hot: Sequence[str]) -> Skeleton | None:
    """``text``'s skeleton, keeping every statement with one of the ``hot``
    substrings on one of its lines; None when the tokenizer is unavailable or
    rejects the text, or the text has line breaks other than ``\\n``."""
    if TokenizerIter is None or "\r" in text or "\0" in text:
        return None
    original = text.split("\n")
    lines = original.copy()
    fast = _fast_cut(text, lines, tuple(hot))
    if fast is not None:
        statements, cut, cut_blanked, hot_lines, semicolons, found = fast
    else:
        found = set()
        hot_positions = _positions(text, hot, found)
        hot_lines = _line_numbers(text, hot_positions)
        semicolons = _lines_with(text, (";",))
        cut, cut_blanked = _cut_cold_bodies(text, lines, hot_positions)
        tokenized = _logical_lines("\n".join(lines) if cut else text)
        if tokenized is None:
            return None
        statements = tokenized
    hot_statements = set(
        _statements_on(statements.first_line, statements.last_line, hot_lines)
    )
    keep = _kept(
        statements,
        lines,
        hot_statements,
        semicolons,
        future="__future__" in text,
    )
    replaced: list[tuple[int, int]] = []
    blanked: set[int] = set()
    for first, last in _runs(statements, keep):
        indent = _indent(lines[first - 1])
        _replace(lines, first, last, indent + "pass")
        replaced.append((first, len(indent.encode())))
        blanked.update(range(first, last + 1))
    headers: list[tuple[int, int]] = []
    for index in _strippable_headers(statements, hot_statements, blanked, lines):
        first, last = statements.first_line[index], statements.last_line[index]
        indent = _indent(lines[first - 1])
        _replace(lines, first, last, f"{indent}def {statements.second_token[index]}():")
        headers.append((first, len(indent.encode())))
        blanked.update(range(first, last + 1))
    # A body cut before tokenizing is replaced again above (its ``pass`` is
    # never kept), unless it was no body: then its ``pass`` is left inside
    # whatever statement holds it (a string), and the scanner's check that
    # every ``pass`` is a statement sends the file to a whole parse.
    replaced.extend(p for p in cut if p[0] not in blanked)
    blanked.update(cut_blanked)
    return Skeleton(
        "\n".join(lines),
        replaced,
        frozenset(blanked),
        frozenset(found),
        headers,
        original,
    )


class _FastCut(NamedTuple):
    statements: _Statements
    replaced: list[tuple[int, int]]
    blanked: set[int]
    hot_lines: list[int]
    semicolons: list[int]
    found: set[str]


def _fast_cut(text: str, lines: list[str], hot: tuple[str, ...]) -> _FastCut | None:
    """From the C lexer (``_lexer.c``): the lines holding a ``hot`` needle
    or a ``;``, the needles found, and the table of logical lines with the
    body of every function that has no hot line and no ``global``/
    ``nonlocal`` already one ``pass`` row; that cut made in ``lines`` (its
    ``pass`` positions and blanked lines as ``_cut_cold_bodies`` returns
    them). None where the C lexer leaves the text to CPython's tokenizer,
    or is not built."""
    if _lexer is None:
        return None
    (hot_lines, scope_lines, semicolons), found = _lexer.needle_lines(
        text, (hot, _SCOPE_WORDS, (";",))
    )
    barriers = sorted({*hot_lines, *scope_lines}) if scope_lines else hot_lines
    table = _lexer.logical_lines(text, barriers)
    if table is None:
        return None
    *columns, cuts = table
    replaced: list[tuple[int, int]] = []
    blanked: set[int] = set()
    for first, last, width in cuts:
        _cut_body(lines, first, last, width, replaced, blanked)
    statements = _from_table(columns)
    return _FastCut(
        statements, replaced, blanked, hot_lines, semicolons, found.intersection(hot)
    )


def _cut_cold_bodies(
    text: str, lines: list[str], hot_positions: list[int]
) -> tuple[list[tuple[int, int]], set[int]]:
    """Replace, in ``lines``, the body of every function with no hot line
    (and no ``global``/``nonlocal``) by ``pass``, before tokenizing: most of
    a file's tokens are in such bodies, and none of them can matter (names
    they bind are local; a hot token would have made a line hot). Found from
    the text's indentation alone (regular expressions, no loop over lines),
    so a ``def`` inside a string or a body that ends inside one is possible:
    the caller verifies every ``pass``, and a cut that breaks a string or a
    bracket fails the tokenizer (then the file is parsed whole). Returns the
    ``pass`` positions and the blanked lines."""
    replaced: list[tuple[int, int]] = []
    blanked: set[int] = set()
    if "def " not in text:
        return replaced, blanked
    # Offsets of hot tokens and scope words: a body holding one stays.
    barriers = sorted({*hot_positions, *_positions(text, _SCOPE_WORDS)})
    size = len(text)
    # Line numbers are counted only for the bodies cut: disjoint, in order.
    line, counted, cut_until = 1, 0, 0

    for start, indent in _def_lines(text):
        if start < cut_until:
            continue
        ends = _block_end(indent)
        header_end = text.find("\n", start)
        if header_end < 0:
            break
        if _HEADER_END.search(text, start, header_end) is None:
            # A signature over several lines ends on a line ``) ...:`` at
            # the ``def``'s indentation.
            closing = ends.search(text, header_end)
            if closing is None:
                continue
            after = closing.end()
            header_end = text.find("\n", after)
            if header_end < 0 or text[after : after + 1] != ")":
                continue
            if closing.end() - closing.start() - 1 != indent or not (
                _HEADER_END.search(text, after, header_end)
            ):
                continue
        body = _BODY_LINE.search(text, header_end)
        if body is None or len(body.group(1)) <= indent:
            continue  # a one-line body, or none
        end = ends.search(text, body.end())
        stop = end.start() if end is not None else size
        at = bisect_right(barriers, body.start())
        if at < len(barriers) and barriers[at] < stop:
            continue
        if not _balanced(text, body.start(), stop):
            continue  # left to the tokenizer, which reports a broken bracket
        line += text.count("\n", counted, body.start() + 1)
        first = line
        line += text.count("\n", body.start() + 1, stop)
        last, counted = line, stop
        _cut_body(lines, first, last, len(body.group(1)), replaced, blanked)
        cut_until = stop
    return replaced, blanked


def _cut_body(
    lines: list[str],
    first: int,
    last: int,
    width: int,
    replaced: list[tuple[int, int]],
    blanked: set[int],
) -> None:
    """A function body on lines ``first``..``last``, indented ``width``
    spaces, becomes one ``pass``; its position and lines are recorded."""
    _replace(lines, first, last, " " * width + "pass")
    replaced.append((first, width))
    blanked.update(range(first, last + 1))


def _def_lines(text: str) -> Iterator[tuple[int, int]]:
    """(offset, indentation) of each line that starts, after spaces, with
    ``def `` or ``async def ``: a ``str.find`` loop (a multiline regular
    expression tries every line start)."""
    position = text.find("def ")
    while position >= 0:
        start = text.rfind("\n", 0, position) + 1
        prefix = text[start:position]
        head = prefix.lstrip(" ")
        if not head or (head.startswith("async") and not head[5:].strip(" ")):
            yield start, len(prefix) - len(head)
        position = text.find("def ", position + 4)


def _balanced(text: str, start: int, stop: int) -> bool:
    """As many of each opening bracket as closing ones in the span (brackets
    inside strings and comments count too: a span that only looks broken is
    just not cut)."""
    return all(
        text.count(opening, start, stop) == text.count(closing, start, stop)
        for opening, closing in _BRACKETS
    )


@lru_cache(maxsize=64)
def _block_end(indent: int) -> re.Pattern[str]:
    """The line break before the next line that is not blank, not only a
    comment, and indented at most ``indent`` spaces (what ends a block
    opened at ``indent``)."""
    return re.compile(rf"\n {{0,{indent}}}(?=[^ \n#])")


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _replace(lines: list[str], first: int, last: int, replacement: str) -> None:
    """Lines ``first``..``last`` (1-based) become ``replacement`` and blanks."""
    lines[first - 1] = replacement
    lines[first:last] = [""] * (last - first)


def _strippable_headers(
    statements: _Statements,
    hot_statements: set[int],
    blanked: set[int],
    lines: list[str],
) -> Iterator[int]:
    """Indices of the ``def`` headers whose parameters, defaults and return
    annotation cannot matter: the scanner reads a function's name and
    decorators (their own lines, kept); it walks the header's expressions
    only for a finding on a hot line, and one without a hot token could only
    be a status bound spelled otherwise (``0x190``, ``4_00``) or a
    ``//  100`` - such headers are kept whole."""
    for index, token in enumerate(statements.first_token):
        if token != "def" or not statements.header[index] or index in hot_statements:
            continue
        first, last = statements.first_line[index], statements.last_line[index]
        if first in blanked:
            continue
        header = "\n".join(lines[first - 1 : last])
        if "//" in header or _OTHER_INTEGER.search(header) is not None:
            continue
        yield index


class _Statements(NamedTuple):
    """The logical lines of a file, as parallel lists (cheaper than objects)."""

    first_line: list[int]
    last_line: list[int]
    depth: list[int]
    first_token: list[str]
    second_token: list[str | None]
    # Ends with ``:``: a compound statement's header, its block follows.
    header: list[bool]
    # ``N = ...`` (a possible alias binding) or not.
    assignment: list[bool]


def _logical_lines(text: str) -> _Statements | None:
    """The logical lines of ``text``, as CPython's tokenizer splits them;
    None when it rejects the text. From the C table (``_lexer.c``) where it
    has one, else from the tokenizer's tokens."""
    table = _lexer.logical_lines(text) if _lexer is not None else None
    if table is not None:
        return _from_table(table[:6])
    return _tokenized_lines(text)


def _from_table(columns: Sequence[list[object]]) -> _Statements:
    """The six columns of a C table, with the ``assignment`` column."""
    return _Statements(*columns, [second == "=" for second in columns[4]])


def _tokenized_lines(text: str) -> _Statements | None:
    rows: list[tuple[int, int, int, str, str | None, bool]] = []
    append = rows.append
    first: str | None = None
    second: str | None = None
    start = depth = 0
    previous = ""
    try:
        for string, kind, line, _, _, _, _ in TokenizerIter(text):
            if kind == _NEWLINE:
                if first is not None:
                    append((start, line, depth, first, second, previous == ":"))
                    first = None
            elif kind == _INDENT:
                depth += 1
            elif kind == _DEDENT:
                depth -= 1
            else:
                if first is None:
                    first, second, start = string, None, line
                elif second is None:
                    second = string
                previous = string
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None
    if not rows:
        return _Statements([], [], [], [], [], [], [])
    columns = [list(column) for column in zip(*rows, strict=True)]
    return _from_table(columns)


def _kept(
    statements: _Statements,
    lines: list[str],
    hot_statements: set[int],
    semicolons: list[int],
    *,
    future: bool,
) -> list[bool]:
    """Per logical line: whether it must stay wherever it is (a hot token,
    an import, a class, a possible alias binding, the first statement)."""
    first_line, last_line = statements.first_line, statements.last_line
    kept = [token in _BINDING_FIRST for token in statements.first_token]
    if kept and future:
        kept[0] = True  # a module docstring: ``from __future__`` must follow
    for index in hot_statements:
        kept[index] = True
    candidates = {
        index for index, assignment in enumerate(statements.assignment) if assignment
    }
    candidates.update(_statements_on(first_line, last_line, semicolons))
    for index in candidates:
        if kept[index]:
            continue
        statement = "\n".join(lines[first_line[index] - 1 : last_line[index]])
        # ``N = a.b``, or ``x(); N = a.b``: ``;`` may start any statement.
        kept[index] = (
            "#" in statement
            or (";" in statement and "=" in statement)
            or (
                statements.assignment[index] and _may_alias(statement.partition("=")[2])
            )
        )
    return kept


def _statements_on(
    first_line: list[int], last_line: list[int], numbers: list[int]
) -> Iterator[int]:
    """Indices of the logical lines that span any of the line ``numbers``."""
    for number in numbers:
        index = bisect_right(first_line, number) - 1
        if index >= 0 and last_line[index] >= number:
            yield index


def _runs(statements: _Statements, kept: list[bool]) -> Iterable[tuple[int, int]]:
    """``_replaceable_runs``, from the C lexer's loop where it is built."""
    if _lexer is None:
        return _replaceable_runs(statements, kept)
    return _lexer.replaceable_runs(  # type: ignore[no-any-return]
        statements.first_line,
        statements.last_line,
        statements.depth,
        statements.first_token,
        statements.header,
        kept,
    )


def _replaceable_runs(
    statements: _Statements, kept: list[bool]
) -> Iterator[tuple[int, int]]:
    """(first line, last line) of each stretch to replace by one ``pass``:
    consecutive whole statements of one block that are all droppable (a
    compound one with its block and clauses, a definition with its
    decorators), else the block of a kept header when all of it is."""
    depth, header, token = statements.depth, statements.header, statements.first_token
    count = len(depth)
    # Whether logical line i starts a statement of its block: not a clause
    # (``else:`` continues the statement before it), not a definition after
    # its decorator.
    starts = [
        first not in _CLAUSES and not (before == "@" and level_before == level)
        for first, before, level, level_before in zip(
            token, ["", *token], depth, [-1, *depth], strict=False
        )
    ]
    # The first index at or after i that is kept (count when none).
    next_kept = [count] * (count + 1)
    for index in range(count - 1, -1, -1):
        next_kept[index] = index if kept[index] else next_kept[index + 1]
    index = 0
    while index < count:
        level = depth[index]
        if starts[index] and not kept[index]:
            boundary = index
            probe = index + 1
            while probe < count and depth[probe] >= level:
                if depth[probe] == level and starts[probe]:
                    boundary = probe
                if kept[probe]:
                    break
                probe += 1
            else:
                boundary = probe  # the block (or the file) ends here
            if boundary > index:
                yield statements.first_line[index], statements.last_line[boundary - 1]
                index = boundary
                continue
        # A ``match`` block holds ``case`` clauses, which ``pass`` cannot
        # replace.
        if header[index] and token[index] != "match":
            end = index + 1
            while end < count and depth[end] > level:
                end += 1
            if end > index + 1 and next_kept[index + 1] >= end:
                yield statements.first_line[index + 1], statements.last_line[end - 1]
                index = end
                continue
        index += 1


def _may_alias(value: str) -> bool:
    return (
        _ALIAS_VALUE.match(value) is not None
        and _LETTER.search(value) is not None
        and _CALL.search(value) is None
        and _NOT_A_NAME.search(value) is None
    )


def _lines_with(
    text: str, needles: Sequence[str], found: set[str] | None = None
) -> list[int]:
    """The 1-based numbers of the lines on which one of ``needles`` occurs;
    the needles that occur are added to ``found``."""
    return _line_numbers(text, _positions(text, needles, found))


def _positions(
    text: str, needles: Sequence[str], found: set[str] | None = None
) -> list[int]:
    """The sorted offsets at which one of ``needles`` occurs; the needles
    that occur are added to ``found``.

    ``str.find`` loops, much faster than a regular expression alternation
    (which tries every alternative at every offset); needles that share a
    ``_PROBES`` substring are found with one loop for it, then checked."""
    positions: list[int] = []
    for probe, members in _grouped(tuple(needles)):
        position = text.find(probe)
        while position >= 0:
            for needle, offset in members:
                start = position - offset
                if start >= 0 and text.startswith(needle, start):
                    positions.append(start)
                    if found is not None:
                        found.add(needle)
            position = text.find(probe, position + 1)
    positions.sort()
    return positions


def _line_numbers(text: str, positions: list[int]) -> list[int]:
    """The 1-based line number of each of the sorted ``positions``."""
    numbers: list[int] = []
    line, previous = 1, 0
    for position in positions:
        line += text.count("\n", previous, position)
        previous = position
        numbers.append(line)
    return numbers


@lru_cache(maxsize=8)
def _grouped(
    needles: tuple[str, ...],
) -> tuple[tuple[str, tuple[tuple[str, int], ...]], ...]:
    """``needles`` by the probe to search for: the first of ``_PROBES`` the
    needle contains, else the needle itself; with each offset of the probe
    in the needle."""
    groups: dict[str, list[tuple[str, int]]] = {}
    for needle in needles:
        probe = next((p for p in _PROBES if p in needle), needle)
        offsets = [i for i in range(len(needle)) if needle.startswith(probe, i)]
        groups.setdefault(probe, []).extend((needle, i) for i in offsets)
    return tuple((probe, tuple(members)) for probe, members in groups.items())
