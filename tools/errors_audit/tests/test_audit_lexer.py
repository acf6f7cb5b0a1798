"""The audit's C lexer (``_lexer.c``, issue 16: cold-audit speed).

Its contract: where ``logical_lines`` returns a table, the table equals the
one built from CPython's own tokenizer (``skeleton._tokenized_lines``);
everywhere else it returns None and the tokenizer decides. ``needle_lines``
finds the lines the ``str.find`` search finds. The real trees are compared
file by file in ``test_real_trees.py``; here: hand-picked edges, generated
sources, the cut of cold function bodies, and calls with wrong arguments.
"""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_omni_errors_audit import skeleton as skeleton_module
from vllm_omni_errors_audit.scanner import _HOT_STATEMENT, scan
from vllm_omni_errors_audit.skeleton import _lines_with, _tokenized_lines

_lexer = skeleton_module._lexer


def test_the_c_lexer_is_built() -> None:
    # pip builds it with the tool (its pyproject.toml, ext-modules); an
    # install without a C compiler still works, slower. Here it must exist,
    # or the speed target and every C-path test below mean nothing.
    assert _lexer is not None, "vllm_omni_errors_audit._lexer was not built"


def _table(text: str) -> list[list[object]] | None:
    table = _lexer.logical_lines(text)
    return None if table is None else [list(column) for column in table[:6]]


def _tokenized(text: str) -> list[list[object]] | None:
    statements = _tokenized_lines(text)
    return None if statements is None else [list(c) for c in statements[:6]]


def _agrees(text: str) -> bool:
    """The C table equals the tokenizer's, or the C lexer declined."""
    table = _table(text)
    return table is None or table == _tokenized(text)


@pytest.mark.parametrize(
    "source",
    [
        "x = 1\n",
        "x = 1",  # no final newline
        "",
        "# only a comment",
        "\n\n   \n",
        "def f(a,\n      b=(1,\n         2)):\n    return a  # c\n\n\n# tail\n",
        "class C:\n    '''doc\n\n    def not_a_def():\n    '''\n    x: int = 1\n",
        "s = 'a\\'b' + \"c\\\"d\" + r'\\'' + rb'\\\\' + f'{x!r:>10}' + BR\"x\"\n",
        "x = '''one\ntwo''' ; y = 2\n",
        "total = 1 + \\\n    2\nz = 3\n",
        "if a:\n    b\nelif c:\n    d\nelse:\n    e\n",
        "try:\n    pass\nexcept (A,\n        B) as e:\n    raise\nfinally:\n    x\n",
        "match x:\n    case [1, *_]:\n        pass\n",
        "@deco(\n    1)\nasync def f():\n    await g()\n",
        "n = 0x_1F + 0o17 + 0b1_0 + 1_000.5e-3j + .5 + 1. + 1.e5 + 00 + 0_0 + 0j\n",
        "a <<= b >>= c **= d //= e\nf := g\nh -> i\n...\nj != k <> l\n",
        "lambda: 0\nx[1:]\nd = {1: 2,\n     3: 4}\n",
        "if x:\n        deep\n        more\nback\n",
        "  indented_first = 1\n",
        "x = 1\n\t\n",  # a tab on a blank line only
        "x = ( # comment\n\t1)\n",  # a tab inside brackets
        "s = 'é' # ünïcode in strings and comments\n",
        "x = 1 + \\\n\ny = 2\n",
    ],
)
def test_the_table_equals_the_tokenizers(source: str) -> None:
    table = _table(source)
    assert table is not None
    assert table == _tokenized(source)


@pytest.mark.parametrize(
    "source",
    [
        "if x:\n\ty = 1\n",  # a tab in an indentation
        "x = 1\n\f\ny = 2\n",  # a form feed
        "é = 1\n",  # a name outside ASCII
        "x = 1 $ 2\n",
        "x = a ? b : c\n",
        "x = `a`\n",
        "x = !a\n",
        "x = 'unterminated\n",
        "x = '''unterminated\n",
        "x = (1,\n",
        "x = 1)\n",
        "x = (1]\n",
        "if x:\n        a\n    b\n",  # a dedent to no outer level
        "n = 0777\n",
        "n = 1__0\n",
        "n = 1_\n",
        "n = 0x\n",
        "n = 1e\n",
        "n = 1if x else 2\n",
        "s = ur'x'\n",
        "s = xb'x'\n",
        "x = 1 + \\\n",  # the text ends after a line continuation
        "x = 1 \\ 2\n",
        "\\\nx = 1\n",
        "x = 1\r\n",
        "s = 'a\rb'\n",  # CPython reads a \r in a string as a line break
        "x = 1  # a\rb\n",
        "x = 1\0\n",
        "x = " + "(" * 201 + ")" * 201 + "\n",
        "".join(" " * depth + "if x:\n" for depth in range(101)) + " " * 101 + "y\n",
    ],
)
def test_what_it_does_not_follow_is_left_to_the_tokenizer(source: str) -> None:
    assert _lexer.logical_lines(source) is None
    # And the audit's result is still the whole parse's.
    data = source.encode()
    assert scan(data).to_json() == scan(data, whole=True).to_json()


def test_a_string_that_is_not_utf8_is_left_to_the_tokenizer() -> None:
    assert _lexer.logical_lines("x = '\udc80'\n") is None


def test_the_deepest_nesting_cpython_allows_is_followed() -> None:
    brackets = "x = " + "(" * 199 + ")" * 199 + "\n"
    assert _table(brackets) == [[1], [1], [0], ["x"], ["="], [False]]
    blocks = "".join(" " * depth + "if x:\n" for depth in range(99)) + " " * 99 + "y\n"
    assert _agrees(blocks) and _table(blocks) is not None


# Lines of Python and of near-Python: every kind of token, bracket, string
# and indentation the lexer handles, and the ones it must decline.
_FRAGMENTS = [
    "x = 1",
    "def f(a, b=2):",
    "async def g():",
    "class C(B):",
    "if x:",
    "elif y:",
    "else:",
    "try:",
    "except E as e:",
    "pass",
    "return (",
    "1,",
    ")",
    "]",
    "}",
    "[1,",
    "{'a':",
    "'''doc",
    "'''",
    '"""',
    "s = 'a\\'b'",
    'r"\\""',
    "f'{x}'",
    "rb'x' Rb'y'",
    "ur'x'",
    "u'x'",
    "x = \\",
    "# comment",
    "",
    "0777",
    "0x_1F",
    "1_000.5e-3j",
    "1__0",
    "1if x else 2",
    "...",
    "a := b",
    "x -> y",
    "@decorator",
    "$",
    "é = 1",
    "'é'",
    "x\f= 1",
    "lambda: 0",
    "x = 1; y = 2",
    "while x: y",
    "0b102",
    "1.e5",
    ".5",
    "a <> b",
    "!x",
    "x != y",
    "import a.b as c",
    "from . import (a,",
    "raise ValueError('x')",
    "    ",
    "\\",
    "'",
    '"',
]


# The fragments the lexer follows when they are well placed: sources made of
# these alone are mostly accepted, so the equality below is tested, not
# only the refusals.
_FOLLOWED = [
    f
    for f in _FRAGMENTS
    if f.isascii()
    and not any(bad in f for bad in ("$", "!x", "\f", "0777", "1__0", "1if", "0b102"))
    and f not in ("ur'x'", "\\", "'", '"')
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([_FRAGMENTS, _FOLLOWED]).flatmap(
        lambda fragments: st.lists(
            st.tuples(
                st.sampled_from(["", "    ", "  ", "        ", "\t", " "]),
                st.sampled_from(fragments),
            ),
            max_size=14,
        )
    ),
    st.booleans(),
)
def test_generated_sources_agree_or_are_declined(
    lines: list[tuple[str, str]], final_newline: bool
) -> None:
    text = "\n".join(indent + fragment for indent, fragment in lines)
    if final_newline:
        text += "\n"
    table = _table(text)
    if table is not None:
        assert table == _tokenized(text)


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(
            list("ab_1 (\n)[]{}:'\"\\#=.,;\t\f\r@rbfu0xe+-*/<>!$\u00e9")
        ),
        max_size=80,
    )
)
def test_random_characters_agree_or_are_declined(text: str) -> None:
    # Found by a fuzzer under AddressSanitizer: a \r inside a string was
    # followed as a character, while CPython reads it as a line break.
    if "\0" in text:
        return
    table = _table(text)
    if table is not None:
        assert table == _tokenized(text)


# -- the cut of cold function bodies -------------------------------------------

_CUT_SOURCE = textwrap.dedent(
    """\
    import os

    def cold(a,
             b):
        x = a + b
        return x

    @decorator
    async def also_cold():
        await thing()

    def hot():
        def inner_cold():
            return 1

        raise ValueError("x")

    def one_line(): return 1

    class Kept:
        def method(self):
            return self

        def sets_g(self):
            global G
            G = 1
    """
)


def test_cold_bodies_become_one_pass_row() -> None:
    text = _CUT_SOURCE
    (hot, scope), _ = _lexer.needle_lines(
        text, (("raise", "import"), ("global", "nonlocal"))
    )
    assert hot == [1, 16] and scope == [25]
    table = _lexer.logical_lines(text, sorted({*hot, *scope}))
    first_line, last_line, depth, first, second, header, cuts = table
    # (first line, last line, indentation) of each cut body: cold (5-6),
    # also_cold (10), inner_cold (14) inside the hot function, method
    # (22); not hot's body (its raise), not the one-line body, not the body
    # with ``global``.
    assert cuts == [(5, 6, 4), (10, 10, 4), (14, 14, 8), (22, 22, 8)]
    rows = list(zip(first_line, last_line, depth, first, second, header, strict=True))
    assert rows == [
        (1, 1, 0, "import", "os", False),
        (3, 4, 0, "def", "cold", True),
        (5, 5, 1, "pass", None, False),
        (8, 8, 0, "@", "decorator", False),
        (9, 9, 0, "async", "def", True),
        (10, 10, 1, "pass", None, False),
        (12, 12, 0, "def", "hot", True),
        (13, 13, 1, "def", "inner_cold", True),
        (14, 14, 2, "pass", None, False),
        (16, 16, 1, "raise", "ValueError", False),
        (18, 18, 0, "def", "one_line", False),
        (20, 20, 0, "class", "Kept", True),
        (21, 21, 1, "def", "method", True),
        (22, 22, 2, "pass", None, False),
        (24, 24, 1, "def", "sets_g", True),
        (25, 25, 2, "global", "G", False),
        (26, 26, 2, "G", "=", False),
    ]
    # Without barriers nothing is cut, and the table is the tokenizer's.
    whole = _lexer.logical_lines(text)
    assert whole[6] == []
    assert [list(column) for column in whole[:6]] == _tokenized(text)


def test_the_skeleton_from_the_cut_finds_what_the_whole_parse_finds() -> None:
    data = _CUT_SOURCE.encode()
    fast = scan(data)
    assert fast.to_json() == scan(data, whole=True).to_json()
    assert [(f.rule, f.line) for f in fast.findings] == [("OMNI001", 16)]


# -- the needle search ---------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "a = 1\nx = VLLMValidationError\n# 4000 and 599\nErrorInfo; Error\n",
        "raise\nraise raise\n\nimport x; from y import z\n",
        "é = 'ErrorInfo' # raise\nno\n400",
        "",
        "\n\n\n",
    ],
)
def test_needle_lines_finds_what_str_find_finds(text: str) -> None:
    (hot, semicolons), found = _lexer.needle_lines(text, (_HOT_STATEMENT, (";",)))
    expected_found: set[str] = set()
    assert hot == sorted(set(_lines_with(text, _HOT_STATEMENT, expected_found)))
    assert semicolons == sorted(set(_lines_with(text, (";",))))
    assert found == expected_found | ({";"} if semicolons else set())
    # Bytes give the same lines (the needles are ASCII).
    (hot_bytes, _), found_bytes = _lexer.needle_lines(
        text.encode(), (_HOT_STATEMENT, (";",))
    )
    assert hot_bytes == hot and found_bytes == found


@given(st.text(alphabet="raise\n;ErrInfo 4059/é", max_size=200))
def test_needle_lines_on_generated_text(text: str) -> None:
    needles = ("raise", "Error", "ErrorInfo", "400", "599", "// 100", ";", "é")
    found: set[str] = set()
    (lines,), present = _lexer.needle_lines(text, (needles,))
    assert lines == sorted(set(_lines_with(text, needles, found)))
    assert present == found


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: _lexer.logical_lines(b"x = 1\n"), TypeError),
        (lambda: _lexer.logical_lines("x", "not a list"), TypeError),
        (lambda: _lexer.logical_lines("x", ["one"]), TypeError),
        (lambda: _lexer.logical_lines(), TypeError),
        (lambda: _lexer.replaceable_runs([1], [1], [0], ["x"], [False]), TypeError),
        (lambda: _lexer.replaceable_runs([1], [1], [0], ["x"], [False], []), TypeError),
        (lambda: _lexer.replaceable_runs([1], [1], ["a"], ["x"], [0], [0]), TypeError),
        (lambda: _lexer.needle_lines("x", ("a",)), TypeError),
        (lambda: _lexer.needle_lines(1, (("a",),)), TypeError),
        (lambda: _lexer.needle_lines("x", (("",),)), ValueError),
        (lambda: _lexer.needle_lines("x", ((1,),)), ValueError),
        (lambda: _lexer.needle_lines("x", (tuple(map(str, range(257))),)), ValueError),
    ],
)
def test_wrong_arguments_raise_not_crash(call: object, error: type) -> None:
    with pytest.raises(error):
        call()  # type: ignore[operator]


@pytest.mark.parametrize(
    "data",
    [
        b"if status >= 400:\n    raise HTTPException(404)\nx = 500  # 599\n",
        b"a = 400\r\nb = 1\rc = HTTPException\r\n",
        "F\u00e9hler = HTTPException\nx = F\u00e9hler(400)\n".encode(),
        b"",
    ],
)
def test_token_lines_in_c_equal_the_python_search(
    data: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_omni_errors_audit import scanner as scanner_module

    tokens = (b"400", b"404", b"500", b"599", b"HTTPException", "F\u00e9hler".encode())
    fast = scanner_module._token_lines(data, tokens)
    monkeypatch.setattr(scanner_module, "_lexer", None)
    assert fast == sorted(set(scanner_module._token_lines(data, tokens)))
