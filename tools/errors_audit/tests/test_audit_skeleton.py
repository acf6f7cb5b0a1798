"""The skeleton (issue 16, speed): parsing it finds exactly what parsing the
whole file finds.

Each case is a construct where dropping the wrong statement would change a
result: aliases bound or used in statements that look cold, ``;``, clauses,
decorators, ``match``, a module docstring before ``from __future__``. Every
case asserts the skeleton's result equals the whole parse's and, where the
skeleton is meant to be used, that it was (so the equality is not the
fallback comparing the whole parse with itself). The real trees are compared
in ``test_real_trees.py``.

Every test runs twice: with the C lexer (``_lexer.c``, the table and the
cut from exact logical lines) and without it (CPython's tokenizer after the
indentation-based cut), the path of an install without a C compiler.
"""

from __future__ import annotations

import textwrap

import pytest

from vllm_omni_errors_audit import scanner as scanner_module
from vllm_omni_errors_audit import skeleton as skeleton_module
from vllm_omni_errors_audit.scanner import FileResult, _skeleton_scanner, scan
from vllm_omni_errors_audit.skeleton import (
    _cut_cold_bodies,
    _lines_with,
    _positions,
    skeleton,
)


@pytest.fixture(autouse=True, params=["c-lexer", "tokenizer"])
def lexer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "tokenizer":
        monkeypatch.setattr(skeleton_module, "_lexer", None)
        monkeypatch.setattr(scanner_module, "_lexer", None)
    else:
        assert skeleton_module._lexer is not None, "the C lexer was not built"
    return str(request.param)


def _same(source: str, *, skeleton_used: bool = True) -> FileResult:
    data = textwrap.dedent(source).encode()
    fast, whole = scan(data), scan(data, whole=True)
    assert fast.to_json() == whole.to_json()
    assert (_skeleton_scanner(data) is not None) is skeleton_used
    return fast


def _rules(result: FileResult) -> list[tuple[str, int]]:
    return [(finding.rule, finding.line) for finding in result.findings]


def test_cold_statements_become_pass_and_the_rest_keeps_its_place() -> None:
    source = textwrap.dedent(
        '''\
        """Module docstring."""
        from __future__ import annotations
        import os

        def helper(x):
            """Cold: becomes one pass."""
            y = x + 1
            return y

        def check(value):
            total = compute(
                value,
            )
            if total < 0:
                raise ValueError("total must be positive")
            return total
        '''
    )
    shape = skeleton(source, ("raise", "import"))
    assert shape is not None
    original = source.split("\n")
    lines = shape.source.split("\n")
    assert len(lines) == len(original)
    assert lines[:3] == original[:3]  # docstring, future, import
    # The cold function, header and all, is one pass; lines keep their place.
    assert lines[4:9] == ["pass", "", "", "", ""]
    assert lines[9] == "def check():"  # parameters cannot matter
    assert lines[10:13] == ["    pass", "", ""]  # total = compute(...)
    assert lines[13:15] == original[13:15]  # the if and its raise
    assert lines[15] == "    pass"  # return total
    assert shape.replaced == [(5, 0), (11, 4), (16, 4)]
    assert shape.headers == [(10, 0)]
    assert _rules(_same(source)) == [("OMNI001", 15)]


def test_an_alias_used_on_a_cold_line_falls_back_to_the_whole_parse() -> None:
    # ``HE(404)`` has no trigger token: only the binding says it is an
    # HTTPException, so the skeleton (which dropped the line) is not used.
    result = _same(
        """\
        from fastapi import HTTPException as HE

        def lookup(key):
            error = HE(404, "missing")
            return error
        """,
        skeleton_used=False,
    )
    assert _rules(result) == [("OMNI005", 4)]


def test_a_returned_alias_of_an_error_builder_falls_back() -> None:
    result = _same(
        """\
        from vllm.entrypoints.openai.protocol import ErrorResponse
        ER = ErrorResponse

        def handler(request):
            try:
                return run(request)
            except Exception:
                return ER(message="bad")
        """,
        skeleton_used=False,
    )
    assert [rule for rule, _ in _rules(result)] == ["OMNI003"]


@pytest.mark.parametrize(
    "binding",
    [
        "LocalVE = ValueError",
        "LocalVE = builtins.ValueError",
        "LocalVE = (\n        ValueError\n    )",
        "x = 1; LocalVE = ValueError",
        "LocalVE = ValueError  # an alias",
    ],
)
def test_local_alias_bindings_are_kept(binding: str) -> None:
    source = (
        "import builtins\n\ndef f(x):\n    "
        + binding
        + "\n    y = x * 2\n    if y:\n        raise LocalVE('bad')\n"
    )
    result = _same(source)
    assert [rule for rule, _ in _rules(result)] == ["OMNI001"]


def test_clauses_decorators_match_and_one_line_statements() -> None:
    result = _same(
        """\
        import abc
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            from x import Y

        class Base(abc.ABC):
            size = 3

            @abc.abstractmethod
            def run(self):
                raise NotImplementedError

            @property
            def cold(self):
                return self.size

            def work(self, kind):
                try:
                    value = self.size
                except KeyError:
                    value = 0
                else:
                    value += 1
                finally:
                    done = True
                match kind:
                    case 1:
                        other = 2
                    case _:
                        raise TypeError("kind")
                if value: value = 2
                for item in range(3): pass
                while False: break
                return value
        """
    )
    assert _rules(result) == [("OMNI001", 31)]


def test_a_match_whose_cases_have_nothing_to_audit_keeps_its_cases() -> None:
    result = _same(
        """\
        def f(kind):
            match kind:  # HTTPStatus names the kinds
                case 1:
                    other = 2
                case _:
                    other = 3
            raise ValueError(other)
        """
    )
    assert _rules(result) == [("OMNI001", 7)]


@pytest.mark.parametrize(
    "default", ["code >= 0x1F4", "code >= 5_00", "code //  100 == 5"]
)
def test_a_header_with_a_status_bound_spelled_otherwise_is_kept(default: str) -> None:
    # The scanner walks a function's parameters when its body has a hot
    # line; these bounds have no hot token, so the header stays whole.
    result = _same(
        f"""\
        def check(code, late={default}):
            seen = code * 2
            if code >= 500:
                raise ValueError(seen)
        """
    )
    assert _rules(result) == [("OMNI004", 1), ("OMNI004", 3), ("OMNI001", 4)]


def test_a_broad_except_returning_a_client_error_is_found() -> None:
    result = _same(
        """\
        from vllm.exceptions import VLLMValidationError
        ERRORS = (ValueError, TypeError)

        def parse(raw):
            try:
                value = int(raw)
                other = value * 2
            except ERRORS as exc:
                return VLLMValidationError(str(exc))
            return other
        """
    )
    assert [rule for rule, _ in _rules(result)] == ["OMNI002"]


def test_status_comparisons_on_hot_lines_are_kept() -> None:
    result = _same(
        """\
        def classify(response):
            code = response.status
            if code >= 500:
                retry = True
            kind = "client" if 400 <= code < 500 else "server"
            return kind
        """
    )
    assert [rule for rule, _ in _rules(result)] == ["OMNI004", "OMNI004"]


def test_a_syntax_error_the_tokenizer_sees_is_still_reported() -> None:
    result = _same(
        """\
        def cold(x):
            y = (x + 1

        def hot():
            raise ValueError("x")
        """,
        skeleton_used=False,
    )
    assert [rule for rule, _ in _rules(result)] == ["OMNI000"]


def test_a_syntax_error_inside_a_statement_with_nothing_to_audit_is_not() -> None:
    # The documented trade (docs/errors/migration.md): the statement is
    # dropped before parsing, so the file is audited instead of being an
    # OMNI000 finding; the whole parse still reports it.
    data = textwrap.dedent(
        """\
        def cold(x):
            y = = x

        def hot():
            raise ValueError("x")
        """
    ).encode()
    assert [f.rule for f in scan(data).findings] == ["OMNI001"]
    assert [f.rule for f in scan(data, whole=True).findings] == ["OMNI000"]


@pytest.mark.parametrize(
    "source",
    [
        "def f():\r\n    raise ValueError('x')\r\n",  # line breaks other than \n
        "def f():\n    x = 1\n    raise ValueError('x')\0\n",  # a NUL byte
    ],
)
def test_what_the_skeleton_does_not_handle_is_parsed_whole(source: str) -> None:
    data = source.encode()
    assert _skeleton_scanner(data) is None
    assert scan(data).to_json() == scan(data, whole=True).to_json()


def test_hot_lines_are_found_through_shared_probes() -> None:
    text = "a = 1\nx = VLLMValidationError\n# 4000 and 599\nErrorInfo; Error\n"
    found: set[str] = set()
    needles = ("VLLMValidationError", "ErrorInfo", "400", "599", "raise")
    assert sorted(set(_lines_with(text, needles, found))) == [2, 3, 4]
    assert found == {"VLLMValidationError", "ErrorInfo", "400", "599"}


# -- function bodies cut before tokenizing --------------------------------------


def test_a_cold_body_is_cut_before_tokenizing_and_its_pass_replaced_again() -> None:
    source = textwrap.dedent(
        """\
        def cold(
            x: int,
        ) -> int:
            y = x + 1
            return y

        def hot():
            raise ValueError("x")
        """
    )
    lines = source.split("\n")
    hot = _positions(source, ("raise", "import"))
    # The tokenizer never sees the cold body: one pass at its indentation.
    assert _cut_cold_bodies(source, lines, hot) == ([(4, 4)], {4, 5, 6})
    assert lines[3:6] == ["    pass", "", ""]
    shape = skeleton(source, ("raise", "import"))
    assert shape is not None
    # Then the cold function (its signature over three lines) is one pass,
    # as before; only the hot one's raise stays.
    assert shape.source.split("\n")[:5] == ["pass", "", "", "", ""]
    assert _rules(_same(source)) == [("OMNI001", 8)]


def test_a_body_that_binds_outside_itself_is_not_cut() -> None:
    # ``global``: the function binds a module name the raise below uses.
    result = _same(
        """\
        def install():
            global Boom
            Boom = ValueError

        def hot():
            raise Boom("x")
        """
    )
    assert _rules(result) == [("OMNI001", 6)]


@pytest.mark.parametrize(
    "source",
    [
        # A def in a docstring, with an indented "body" that is text.
        '''\
        def hot():
            """Example:

            def example():
                return 1
            """
            raise ValueError("x")
        ''',
        # A body whose string goes on at column 0: the cut would end there.
        '''\
        def cold():
            text = """
        line at column 0
        """
            return text

        def hot():
            raise ValueError("x")
        ''',
        # A raise message over several lines, with a def in it.
        '''\
        def hot():
            raise ValueError(
                """
            def f():
                x = 1
                """
            )
        ''',
    ],
    ids=["def-in-docstring", "string-at-column-0", "def-in-a-raise-message"],
)
def test_what_only_looks_like_a_body_gives_the_whole_parse_result(
    source: str,
) -> None:
    scan_result = scan(textwrap.dedent(source).encode())
    whole = scan(textwrap.dedent(source).encode(), whole=True)
    assert scan_result.to_json() == whole.to_json()
    assert [rule for rule, _ in _rules(whole)] == ["OMNI001"]


def test_an_unterminated_string_in_a_cold_body_is_the_documented_trade() -> None:
    # Like ``y = = x`` in a dropped statement: the body is cut before the
    # tokenizer sees it, so the file is audited; the whole parse reports it.
    data = textwrap.dedent(
        """\
        def cold(x):
            y = "unterminated

        def hot():
            raise ValueError("x")
        """
    ).encode()
    assert [f.rule for f in scan(data).findings] == ["OMNI001"]
    assert [f.rule for f in scan(data, whole=True).findings] == ["OMNI000"]
