"""The rules on the fixture tree and on small sources: what is (not) a finding.

The fixture tree's expectations are its ``# expect:`` comments; the raise-site
inventory is checked against a census written here with ``ast.walk`` alone.
"""

from __future__ import annotations

import ast
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from audit_testing import REPO, TREE, TREE_ARG, expected_findings
from vllm_omni_errors_audit.runner import Report, run_audit
from vllm_omni_errors_audit.scanner import scan

# Known totals of the fixture tree, per rule (the annotations give the lines).
EXPECTED_COUNTS = {
    "OMNI000": 1,
    "OMNI001": 18,
    "OMNI002": 7,
    "OMNI003": 5,
    "OMNI004": 10,
    "OMNI005": 7,
}


@pytest.fixture
def report(monkeypatch: pytest.MonkeyPatch) -> Report:
    monkeypatch.chdir(REPO)
    return run_audit([TREE_ARG], jobs=1, cache=None)


def census(root: Path) -> dict[str, Counter[str]]:
    """Raise sites by name and top-level folder, from ast.walk only."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for path in root.rglob("*.py"):
        try:
            tree = ast.parse(path.read_bytes())
        except SyntaxError:
            continue
        parts = path.relative_to(root).parts
        folder = parts[0] if len(parts) > 1 else "."
        for node in ast.walk(tree):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name):
                name = target.id
            elif isinstance(target, ast.Attribute):
                name = target.attr
            else:
                continue
            # ``raise exc``: a variable (lower-case by convention), one row.
            counts["(variable)" if name.lstrip("_")[:1].islower() else name][
                folder
            ] += 1
    return counts


def handler(caught: str, body: str) -> str:
    """A try statement whose except clause for ``caught`` runs ``body``."""
    return f"try:\n    f()\nexcept {caught}:\n    {body}"


def rules_of(source: str) -> list[str]:
    return sorted(f.rule for f in scan(source.encode()).findings)


def test_findings_are_exactly_the_annotated_lines(report: Report) -> None:
    found = {(f.path, f.line, f.rule) for f in report.findings}
    expected = expected_findings()
    assert found - expected == set(), "unexpected findings"
    assert expected - found == set(), "missed findings"


def test_counts_per_rule_are_known(report: Report) -> None:
    assert Counter(f.rule for f in report.findings) == EXPECTED_COUNTS
    assert report.files == 6


def test_inventory_equals_an_independent_census(report: Report) -> None:
    assert report.inventory == census(TREE)
    assert report.inventory["ValueError"] == Counter(
        {".": 1, "engine": 9, "vllm_omni": 1}
    )


def test_errors_package_may_build_statuses(report: Report) -> None:
    owned = [f for f in report.findings if f.folder == "vllm_omni"]
    assert [f.rule for f in owned] == ["OMNI001"]


def test_a_syntax_error_is_a_finding_not_a_crash(report: Report) -> None:
    (broken,) = [f for f in report.findings if f.rule == "OMNI000"]
    assert broken.path.endswith("broken/syntax.py")
    assert (broken.line, broken.column) == (1, 12)
    assert broken.message.startswith("syntax error")


@pytest.mark.parametrize(
    ("source", "rules"),
    [
        # raise sites: semantic and inventory-only types are not findings
        ("raise RuntimeError('x')", []),
        ("raise KeyError('x')", []),
        ("raise AttributeError('x')", []),
        ("raise VLLMValidationError('x', parameter='n')", []),
        ("raise errors.GuardrailViolationError('x')", []),
        ("raise", []),
        ("raise UnicodeDecodeError('utf-8', b'', 0, 1, 'bad')", ["OMNI001"]),
        ("from builtins import TypeError as T\nraise T('x')", ["OMNI001"]),
        ("if typing.TYPE_CHECKING:\n    raise TypeError", []),
        ("@field_validator('x')\ndef f(v):\n    raise ValueError", []),
        ("@abstractmethod\ndef f(self):\n    raise NotImplementedError", []),
        (
            "@abstractmethod\ndef f(self):\n    def g():\n"
            "        raise NotImplementedError",
            ["OMNI001"],
        ),
        # "directly in the body": a conditional raise is a decision
        (
            "@abstractmethod\ndef f(self, x):\n    if x:\n"
            "        raise NotImplementedError",
            ["OMNI001"],
        ),
        (
            "@abc.abstractmethod\ndef f(self):\n    'Doc.'\n"
            "    raise NotImplementedError",
            [],
        ),
        # a function-local alias of a raw type
        ("def f():\n    LocalVE = ValueError\n    raise LocalVE('x')", ["OMNI001"]),
        (
            "def f():\n    Bad = builtins.TypeError\n    raise Bad",
            ["OMNI001"],
        ),
        ("def f():\n    err = make()\n    raise err", []),
        # attrs converts nothing; pydantic converts ValueError only
        (
            "@define\nclass C:\n    x: int = field()\n\n    @x.validator\n"
            "    def check(self, attribute, value):\n        raise ValueError('x')",
            ["OMNI001"],
        ),
        (
            "import attr\n@attr.s\nclass C:\n    x = attr.ib()\n\n"
            "    @x.validator\n    def check(self, a, v):\n"
            "        if v < 0:\n            raise ValueError('x')",
            ["OMNI001"],
        ),
        (
            "from pydantic import validator\n@validator('x')\ndef f(cls, v):\n"
            "    if v < 0:\n        raise ValueError('x')",
            [],
        ),
        (
            "import pydantic\n@pydantic.validator('x')\ndef f(cls, v):\n"
            "    raise ValueError('x')",
            [],
        ),
        # HTTPException: import forms, and look-alikes
        (
            "from starlette.exceptions import HTTPException\nraise HTTPException(404)",
            ["OMNI005"],
        ),
        ("import fastapi.exceptions as fe\nraise fe.HTTPException(404)", ["OMNI005"]),
        (
            "from fastapi import HTTPException\nE = HTTPException\nraise E(400)",
            ["OMNI005"],
        ),
        ("raise HTTPException(418)", ["OMNI005"]),
        ("class HTTPException(Exception): ...\nraise HTTPException()", []),
        ("from werkzeug.exceptions import HTTPException\nraise HTTPException()", []),
        ("from fastapi import HTTPException\n" + handler("HTTPException", "pass"), []),
        # broad excepts: only a 4xx conversion is a finding
        (handler("ValueError as e", "raise RuntimeError(str(e)) from e"), []),
        (
            handler("ValueError", "return create_error_response('x', status_code=500)"),
            ["OMNI003"],
        ),
        (
            handler("(ValueError, TypeError)", "raise GuardrailViolationError('x')"),
            ["OMNI002"],
        ),
        (handler("ValueError", "return Response(status_code=422)"), ["OMNI002"]),
        (
            "try:\n    f()\nexcept ValueError:\n    return Response('x', 404)",
            ["OMNI002"],
        ),
        (handler("OSError", "raise VLLMValidationError('x')"), []),
        # status ranges
        ("ok = 200 <= status < 300", []),
        ("big = size >= 500", []),
        ("server = resp.status >= 500", ["OMNI004"]),
        ("server = 499 < code", ["OMNI004"]),
        ("client = HTTPStatus(code).is_client_error", ["OMNI004"]),
        ("client = compat.is_client_error_status(code)", ["OMNI004"]),
        ("from x import is_server_error_status as s\nserver = s(code)", ["OMNI004"]),
    ],
)
def test_rule_table(source: str, rules: list[str]) -> None:
    assert rules_of(source) == rules


@pytest.mark.parametrize(
    ("source", "suggestion"),
    [
        ("raise ValueError('temperature must be >= 0')", "VLLMValidationError"),
        ("raise ValueError(f'voice {v} not found')", "VLLMNotFoundError"),
        ("raise ValueError('cannot decode image')", "VLLMUnprocessableEntityError"),
        ("raise TypeError('stage 2 timed out')", "OmniStageTimeoutError"),
        # a constraint on a setting named *timeout is a validation failure
        (
            "raise ValueError('heartbeat_timeout must be positive')",
            "VLLMValidationError",
        ),
        ("raise ValueError('timeout must be > 0, got 0')", "VLLMValidationError"),
        ("raise ValueError(f'invalid delivery_timeout_s: {t}')", "VLLMValidationError"),
        ("raise ValueError('request deadline exceeded')", "OmniStageTimeoutError"),
        ("raise ValueError('Unknown ModelOpt quant algo')", "VLLMValidationError"),
        ("raise ValueError('unknown model: x')", "VLLMNotFoundError"),
        ("raise ValueError('corrupted audio data')", "VLLMUnprocessableEntityError"),
        ("raise ValueError('conflicting rotary dims')", "VLLMValidationError"),
        ("raise ValueError('pipeline unavailable')", "OmniServiceUnavailableError"),
        ("raise NotImplementedError", "OmniNotImplementedError"),
        ("raise HTTPException(404)", "VLLMNotFoundError"),
        ("raise HTTPException(status.HTTP_409_CONFLICT)", "OmniConflictError"),
        (
            "raise HTTPException(HTTPStatus.GATEWAY_TIMEOUT.value)",
            "OmniStageTimeoutError",
        ),
        ("raise HTTPException(429)", "OmniClientError(status_code=429)"),
        ("raise HTTPException(code)", "a semantic VLLMError subtype"),
    ],
)
def test_suggested_type(source: str, suggestion: str) -> None:
    (finding,) = scan(source.encode()).findings
    assert finding.suggestion == suggestion


def test_undecodable_file_is_a_finding(tmp_path: Path) -> None:
    path = tmp_path / "latin.py"
    path.write_bytes(b'# no coding line\nname = "caf\xe9"\nraise ValueError(name)\n')
    (finding,) = scan(path.read_bytes()).findings
    assert (finding.rule, finding.line, finding.column) == ("OMNI000", 2, 12)
    assert "byte 0xe9" in finding.message


def test_declared_encoding_is_honoured() -> None:
    data = b'# -*- coding: latin-1 -*-\ns = "\xe9"; raise ValueError(s)\n'
    (finding,) = scan(data).findings
    assert (finding.rule, finding.line, finding.column) == ("OMNI001", 2, 10)


def test_columns_count_utf16_code_units() -> None:
    prefix = 'x = "\N{GRINNING FACE}"; '
    (finding,) = scan(f"{prefix}raise ValueError()\n".encode()).findings
    assert finding.column == len(prefix.encode("utf-16-le")) // 2 + 1 == 11


@pytest.mark.parametrize("newline", [b"\r\n", b"\r"])
def test_expression_rules_find_lines_with_any_line_ending(newline: bytes) -> None:
    lines = [b"import fastapi", b"x = 1", b"ok = 400 <= status < 500"]
    lines += [b"raise fastapi.HTTPException(404)"]
    findings = scan(newline.join(lines) + newline).findings
    assert [(f.rule, f.line) for f in findings] == [("OMNI004", 3), ("OMNI005", 4)]


@pytest.mark.parametrize(
    "data",
    [
        b"raise x\n\0\n",
        b"x = " + b"(" * 300 + b")" * 300 + b"\nraise x\n",
        b"\xef\xbb\xbfdef(:\n    raise\n",
        # Parses, but deeper than the scanner's recursive name resolution.
        b"raise " + b"a." * 1200 + b"Error()\n",
        b"def f():\n    raise " + b"a." * 1200 + b"Error()\n",
    ],
)
def test_unparsable_bytes_never_crash(data: bytes) -> None:
    (finding,) = scan(data).findings
    assert finding.rule == "OMNI000"


def test_a_file_without_trigger_tokens_is_not_parsed() -> None:
    # No raise, handler return, status or HTTPException token: nothing the
    # rules could find, so only decoding is checked (the cold-run prefilter).
    assert scan(b"def f(:\n").findings == []
    (finding,) = scan(b'x = "caf\xe9"\n').findings
    assert (finding.rule, finding.message[:22]) == ("OMNI000", "undecodable as utf-8: ")


def test_inventory_rows_are_classes_and_one_row_for_variables() -> None:
    source = (
        "try:\n    f()\nexcept OSError as e:\n    raise e\n"
        "raise self._batch_error\nraise _Private('x')\nraise mod.Error\n"
    )
    assert scan(source.encode()).raises == {
        "(variable)": 2,
        "_Private": 1,
        "Error": 1,
    }


def test_findings_of_a_file_are_in_line_order() -> None:
    source = (
        "import fastapi\n"
        "def f(status):\n"
        "    try:\n        g()\n"
        "    except ValueError:\n"
        "        raise fastapi.HTTPException(400)\n"
        "    ok = 400 <= status < 500\n"
        "    raise TypeError('x')\n"
    )
    positions = [(f.line, f.column) for f in scan(source.encode()).findings]
    assert positions == sorted(positions)
    assert len(positions) == 4
