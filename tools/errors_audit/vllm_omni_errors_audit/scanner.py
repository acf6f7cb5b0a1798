"""One file's audit: bytes in, raise-site inventory and candidate findings out.

Owns the AST analysis. The result depends on the file's bytes only (never on
its path), so it can be cached by content hash; path-dependent decisions (the
``vllm_omni/errors`` ownership exemption, the allowlist) are made by the
runner. It must not import anything outside the standard library, and it
never raises for a bad file: a file that does not parse or decode is an
OMNI000 finding.

Speed matters (the 0.30 wheel is 24 MB of source), so the analysis walks
statements only: raises, except clauses, returns and imports are statements.
The expression-level rules (OMNI004 status ranges, OMNI005 HTTPException
calls) walk only the statements whose lines contain a token they need
(``_STATUS_TOKENS``, ``HTTPException`` and the names imported as either): a
necessary condition, so skipping the other statements changes no result.
Status bounds are recognised in their decimal spelling (``400``, not
``0x190``).

Files without any token a finding or a raise site needs (``_TRIGGER_TOKENS``)
are not parsed at all: only their decoding is checked. Every rule matches a
name or literal that must appear in the file's bytes (names resolve through
imports and assignments of the same file, which spell the resolved name), so
skipping such a file changes no inventory count and no finding; a syntax
error in it goes unreported, which hides no raise site. The other files are
analysed from their skeleton (``skeleton``: the statements without such a
token replaced by ``pass`` before parsing; tokenizing, parsing and analysing
it takes about 60% of the time of the whole file) unless the analysis shows
a dropped line might have mattered; ``scan(data, whole=True)`` is the
reference it is tested against.

Each finding carries its enclosing qualified name (``Class.method``,
``<module>``) and its statement's source without whitespace: the
runner fingerprints sites with them, so a baseline survives line moves.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, NamedTuple

from vllm_omni_errors_audit import rules
from vllm_omni_errors_audit.skeleton import Skeleton, _lexer, skeleton

_STATUS_TOKENS = (
    *(str(bound).encode() for bound in sorted(rules.STATUS_BOUNDS)),
    b"//100",
    b"// 100",
    b"HTTPStatus",
    b"is_client_error",
    b"is_server_error",
)
_HTTP_EXCEPTION_TOKEN = b"HTTPException"
# A file containing none of these has no raise site and no finding: raises
# need ``raise``; OMNI002/OMNI003 returns need a client-error type, a status
# carrier (``...Response``, ``create_error_response``, ``ErrorInfo``,
# ``HTTPException``, ``OmniClientError``) or an error-model builder;
# OMNI004/OMNI005 need ``_STATUS_TOKENS`` or ``HTTPException``.
_TRIGGERS = sorted(
    {
        b"raise",
        b"Response",
        *_STATUS_TOKENS,
        *(n.encode() for n in rules.STATUS_CARRIERS),
        *(n.encode() for n in rules.ERROR_MODEL_BUILDERS),
        *(n.encode() for n in rules.CLIENT_ERROR_TYPES),
    }
)
_TRIGGER_TOKENS = re.compile(b"|".join(map(re.escape, _TRIGGERS)))
_TRIGGERS_TEXT = [token.decode() for token in _TRIGGERS]
_TRIGGERS_TUPLE = tuple(_TRIGGERS_TEXT)
# The statements a skeleton keeps (see ``skeleton``): those with a trigger
# token or an import (also inside a one-line compound statement).
_HOT_STATEMENT = tuple(
    needle
    for needle in (*_TRIGGERS_TEXT, "import")
    # ``JSONResponse`` is found as ``Response``: one search less.
    if not any(other != needle and other in needle for other in _TRIGGERS_TEXT)
)
# A name bound to one of these that is not itself a trigger token makes the
# lines it occurs on relevant (``ER = ErrorResponse``; ``return ER(...)``).
_ALIASED_TARGETS = (
    rules.CLIENT_ERROR_TYPES
    | frozenset(rules.STATUS_CARRIERS)
    | rules.ERROR_MODEL_BUILDERS
    | rules.STATUS_RANGE_CALLS
)
MODULE_SCOPE = "<module>"
# Inventory row of ``raise e``, ``raise self._error``: a variable, not a
# class (by naming convention, classes start with a capital letter).
VARIABLE_ROW = "(variable)"
_CODE_LIMIT = 400
# Names whose import aliases make a line relevant to the expression rules.
_ALIASED_NAMES = frozenset({"HTTPException"}) | rules.STATUS_RANGE_CALLS
_STMT_LISTS = frozenset({"body", "orelse", "finalbody", "handlers", "cases"})
_COMPOUND = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.If,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.With,
    ast.AsyncWith,
    ast.Try,
    ast.TryStar,
    ast.Match,
)
_MESSAGE_EXCERPT = 60
_ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_MEMBERSHIP = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)
_NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


@dataclass(frozen=True, slots=True)
class Finding:
    """A candidate finding at a 1-based line and column (UTF-16 code units),
    in ``scope`` (qualified name), on the statement ``code``."""

    rule: str
    line: int
    column: int
    message: str
    suggestion: str
    scope: str = MODULE_SCOPE
    code: str = ""


@dataclass(slots=True)
class FileResult:
    """Raise sites by exception name, and the findings, of one file."""

    raises: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> list[object]:
        return [
            self.raises,
            [
                [f.rule, f.line, f.column, f.message, f.suggestion, f.scope, f.code]
                for f in self.findings
            ],
        ]

    @classmethod
    def from_json(cls, data: list[Any]) -> FileResult:
        raises, findings = data
        return cls(dict(raises), [Finding(*item) for item in findings])


class _Scope(NamedTuple):
    """Raw types that may be raised here without a finding, and where."""

    type_checking: bool
    exempt: frozenset[str]
    # Exempt only directly in the function body (an abstract method's
    # ``raise NotImplementedError``), not in a nested block.
    direct: frozenset[str]
    qualname: str

    def allows(self, name: str) -> bool:
        return self.type_checking or name in self.exempt or name in self.direct

    def nested(self) -> _Scope:
        return self._replace(direct=frozenset()) if self.direct else self


_RUNTIME = _Scope(
    type_checking=False, exempt=frozenset(), direct=frozenset(), qualname=MODULE_SCOPE
)


def scan(data: bytes, *, whole: bool = False) -> FileResult:
    """Audit one file's bytes: from its skeleton where it has one, else (or
    with ``whole``) from the whole file; the results are the same."""
    # ``raise`` first: most files have one, and a plain search for it ends
    # there much sooner than the alternation does.
    if b"raise" not in data and not _has_trigger(data):
        undecodable = _decode_error(data)
        return FileResult(findings=[] if undecodable is None else [undecodable])
    scanner = None if whole else _skeleton_scanner(data)
    if scanner is None:
        try:
            tree = ast.parse(data)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            return FileResult(findings=[_parse_error(data, exc)])
        try:
            scanner = _Scanner(data, tree)
        except RecursionError as exc:
            # Parsed, but nested too deeply for the recursive helpers (a
            # 1,000-level attribute chain): this file is not audited, the
            # rest is.
            return FileResult(findings=[_parse_error(data, exc)])
    result = scanner.result
    result.findings.sort(key=_finding_order)
    return result


def whole_scan(data: bytes, tree: ast.Module) -> _Scanner:
    """The scanner of a whole parse of ``data`` (``tree``), for the migration
    assistant: its ``sites()`` give the node of every finding. Raises
    RecursionError where ``scan`` reports a file nested too deeply."""
    return _Scanner(data, tree)


def _finding_order(finding: Finding) -> tuple[int, int, str]:
    return (finding.line, finding.column, finding.rule)


def _skeleton_scanner(data: bytes) -> _Scanner | None:
    """The scanner of ``data``'s skeleton, or None when the whole file must
    be parsed: no skeleton, a skeleton that does not parse (the file has a
    syntax error the whole parse reports), or one whose analysis shows a
    replaced statement might have mattered."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)
    except (SyntaxError, UnicodeDecodeError):
        return None
    shape = skeleton(text, _HOT_STATEMENT)
    if shape is None or not shape.replaced:
        return None
    # In UTF-8, an ASCII token occurs in the text exactly where it occurs in
    # the bytes: the skeleton's search answers the scanner's.
    present = shape.found if encoding in ("utf-8", "utf-8-sig") else None
    try:
        scanner = _Scanner(data, ast.parse(shape.source), text, present, shape.lines)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return scanner if scanner.matches(shape, text) else None


def _has_trigger(data: bytes) -> bool:
    """Whether one of the trigger tokens occurs in ``data``: one pass in C
    where the lexer is built (the alternation tries every token at every
    offset)."""
    if _lexer is None:
        return _TRIGGER_TOKENS.search(data) is not None
    (lines,), _ = _lexer.needle_lines(data, (_TRIGGERS_TUPLE,))
    return bool(lines)


def raise_site_name(node: ast.Raise) -> str | None:
    """The inventory row of a raise: ``T`` for ``raise T``, ``raise T(...)``,
    ``raise a.b.T(...)``; ``VARIABLE_ROW`` for ``raise e`` or
    ``raise self._error``; None for anything else."""
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    if isinstance(exc, ast.Name):
        name = exc.id
    elif isinstance(exc, ast.Attribute):
        name = exc.attr
    else:
        return None
    return VARIABLE_ROW if name.lstrip("_")[:1].islower() else name


class _Scanner:
    """Collects statements in one pass, then applies the rules to them."""

    def __init__(
        self,
        data: bytes,
        tree: ast.Module,
        text: str | None = None,
        present: frozenset[str] | None = None,
        lines: list[str] | None = None,
    ) -> None:
        self._data = data
        # ``data`` decoded, when the caller already did (the skeleton path).
        self._text = text
        # ``text``'s lines, when the caller already split it.
        self._lines: list[str] | None = lines
        # The qualified name of the statement the expression rules walk.
        self._scope = MODULE_SCOPE
        self._bindings: dict[str, str] = {}
        self._tuple_bindings: dict[str, tuple[str, ...]] = {}
        self._raises: list[tuple[ast.Raise, _Scope]] = []
        self._handlers: list[tuple[ast.ExceptHandler, str]] = []
        self._returns: list[tuple[ast.Return, str]] = []
        self._statements: list[tuple[ast.stmt, str]] = []
        self.result = FileResult()
        # Each finding with the node it was found at, in the order found
        # (``sites``: what the migration assistant rewrites).
        self._sites: list[tuple[Finding, ast.AST]] = []
        self._collect_module(tree)
        self._check_raises()
        self._check_handlers()
        self._check_returns()
        status_tokens = any(_has(data, token, present) for token in _STATUS_TOKENS)
        if status_tokens or _has(data, _HTTP_EXCEPTION_TOKEN, present):
            tokens = (
                *(_STATUS_TOKENS if status_tokens else ()),
                _HTTP_EXCEPTION_TOKEN,
                *self._alias_tokens(),
            )
            hot_lines = _token_lines(data, tokens)
            self._check_expressions(
                self._expressions_on(hot_lines), status_tokens=status_tokens
            )

    def sites(self) -> list[tuple[Finding, ast.AST]]:
        """Each finding with its node, sorted as ``scan`` sorts findings."""
        return sorted(self._sites, key=lambda site: _finding_order(site[0]))

    def callee(self, node: ast.expr) -> str:
        """The resolved last name of a call's (or a class's) target."""
        return self._callee(node)

    def matches(self, shape: Skeleton, text: str) -> bool:
        """Whether this scan of ``shape`` is the whole file's: every ``pass``
        that replaced a statement is one, every cut-down header is a
        function's, and no replaced line names a local alias of an error
        type, builder or status carrier."""
        passes = {
            (stmt.lineno, stmt.col_offset)
            for stmt, _ in self._statements
            if isinstance(stmt, ast.Pass)
        }
        functions = {
            (stmt.lineno, stmt.col_offset)
            for stmt, _ in self._statements
            if isinstance(stmt, ast.FunctionDef)
        }
        if not (
            passes.issuperset(shape.replaced) and functions.issuperset(shape.headers)
        ):
            return False
        aliases = [
            name
            for name, target in self._bindings.items()
            if _last(target) in _ALIASED_TARGETS
            and _TRIGGER_TOKENS.search(name.encode()) is None
        ]
        if not aliases:
            return True
        pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, aliases)) + r")\b")
        lines = shape.lines
        return not any(pattern.search(lines[n - 1]) for n in shape.blanked)

    # -- collection -------------------------------------------------------

    def _collect_module(self, tree: ast.Module) -> None:
        # Module-level imports and aliases first, in order, so that
        # ``E = fastapi.HTTPException`` or ``ERRORS = (ValueError, TypeError)``
        # resolve whatever their position relative to their uses.
        for stmt in tree.body:
            if isinstance(stmt, ast.Import | ast.ImportFrom):
                self._bind_import(stmt)
            elif isinstance(stmt, ast.Assign):
                self._bind_alias(stmt)
        self._collect(tree.body, _RUNTIME)

    def _collect(self, body: list[ast.stmt], scope: _Scope) -> None:
        qualname = scope.qualname
        self._statements.extend((stmt, qualname) for stmt in body)
        inner = scope.nested()
        for stmt in body:
            match stmt:
                case ast.Raise():
                    self._raises.append((stmt, scope))
                case ast.Return():
                    self._returns.append((stmt, qualname))
                case ast.FunctionDef() | ast.AsyncFunctionDef():
                    self._collect(stmt.body, self._function_scope(stmt, scope))
                case ast.ClassDef():
                    self._bindings[stmt.name] = f"<local>.{stmt.name}"
                    self._collect(
                        stmt.body,
                        scope._replace(
                            exempt=frozenset(),
                            direct=frozenset(),
                            qualname=_child(qualname, stmt.name),
                        ),
                    )
                case ast.If():
                    checking = scope.type_checking or _is_type_checking(stmt.test)
                    self._collect(stmt.body, inner._replace(type_checking=checking))
                    self._collect(stmt.orelse, inner)
                case ast.Try() | ast.TryStar():
                    self._collect(stmt.body, inner)
                    for handler in stmt.handlers:
                        self._handlers.append((handler, qualname))
                        self._collect(handler.body, inner)
                    self._collect(stmt.orelse, inner)
                    self._collect(stmt.finalbody, inner)
                case ast.Import() | ast.ImportFrom():
                    self._bind_import(stmt)
                case ast.Assign() if qualname != MODULE_SCOPE:
                    # ``LocalVE = ValueError`` in a function: an alias of an
                    # exception or status carrier (module-level ones are
                    # bound before collection).
                    self._bind_alias(stmt, exceptions_only=True)
                case ast.Match():
                    for case in stmt.cases:
                        self._collect(case.body, inner)
                case ast.For() | ast.AsyncFor() | ast.While():
                    self._collect(stmt.body, inner)
                    self._collect(stmt.orelse, inner)
                case ast.With() | ast.AsyncWith():
                    self._collect(stmt.body, inner)

    def _function_scope(
        self, node: ast.FunctionDef | ast.AsyncFunctionDef, outer: _Scope
    ) -> _Scope:
        exempt: frozenset[str] = frozenset()
        direct: frozenset[str] = frozenset()
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            qualname = self._qualname(target)
            name = _last(qualname)
            direct |= rules.DIRECT_BODY_EXEMPTIONS.get(name, frozenset())
            if rules.is_converting_validator(qualname or ""):
                exempt |= rules.DECORATOR_EXEMPTIONS.get(name, frozenset())
        return _Scope(
            type_checking=outer.type_checking,
            exempt=exempt,
            direct=direct,
            qualname=_child(outer.qualname, node.name),
        )

    def _bind_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self._bindings[alias.asname] = alias.name
                else:
                    head = alias.name.partition(".")[0]
                    self._bindings[head] = head
            return
        module = "." * node.level + (node.module or "")
        for alias in node.names:
            self._bindings[alias.asname or alias.name] = f"{module}.{alias.name}"

    def _bind_alias(self, node: ast.Assign, *, exceptions_only: bool = False) -> None:
        if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
            return
        name = node.targets[0].id
        if exceptions_only:
            target = self._qualname(node.value)
            if _last(target) in rules.ALIASABLE_NAMES:
                self._bindings[name] = target or ""
            return
        if isinstance(node.value, ast.Tuple):
            names = tuple(_last(self._qualname(item)) for item in node.value.elts)
            if all(names):
                self._tuple_bindings[name] = names
            return
        target = self._qualname(node.value)
        if target is not None:
            self._bindings[name] = target

    def _alias_tokens(self) -> list[bytes]:
        return [
            name.encode()
            for name, target in self._bindings.items()
            if _last(target) in _ALIASED_NAMES
        ]

    def _expressions_on(self, hot_lines: list[int]) -> Iterator[tuple[ast.AST, str]]:
        """Roots to walk for the expression rules: every simple statement, and
        the header of every compound statement, that spans a hot line."""
        for stmt, scope in self._statements:
            first = min([stmt.lineno, *(d.lineno for d in _decorators(stmt))])
            end = stmt.end_lineno or stmt.lineno
            index = bisect_left(hot_lines, first)
            if index == len(hot_lines) or hot_lines[index] > end:
                continue
            if not isinstance(stmt, _COMPOUND):
                yield stmt, scope
                continue
            for name, value in ast.iter_fields(stmt):
                if name not in _STMT_LISTS:
                    values = value if isinstance(value, list) else [value]
                    yield from ((v, scope) for v in values if isinstance(v, ast.AST))
            for case in getattr(stmt, "cases", ()):
                yield case.pattern, scope
                if case.guard is not None:
                    yield case.guard, scope

    # -- name resolution ----------------------------------------------------

    def _qualname(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self._bindings.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self._qualname(node.value)
            return None if base is None else f"{base}.{node.attr}"
        return None

    def _callee(self, node: ast.expr) -> str:
        """The resolved last name of a call's (or a class's) target."""
        target = node.func if isinstance(node, ast.Call) else node
        return _last(self._qualname(target))

    def _is_http_exception(self, node: ast.expr) -> bool:
        qualname = self._qualname(node)
        if qualname is None or _last(qualname) != "HTTPException":
            return False
        root = qualname.partition(".")[0]
        return root in rules.HTTP_EXCEPTION_MODULES or qualname == "HTTPException"

    def _caught(self, node: ast.expr | None) -> tuple[str, ...]:
        if node is None:
            return ("BaseException",)
        if isinstance(node, ast.Tuple):
            return tuple(name for item in node.elts for name in self._caught(item))
        if isinstance(node, ast.Name) and node.id in self._tuple_bindings:
            return self._tuple_bindings[node.id]
        return (_last(self._qualname(node)),)

    # -- rules --------------------------------------------------------------

    def _check_raises(self) -> None:
        counts: Counter[str] = Counter()
        for node, scope in self._raises:
            if node.exc is None:
                continue
            site = raise_site_name(node)
            if site is not None:
                counts[site] += 1
            name = self._callee(node.exc)
            if name in rules.RAW_RAISE_SUGGESTIONS and not scope.allows(name):
                message = _message_literal(node.exc)
                excerpt = f" ({message[:_MESSAGE_EXCERPT]!r})" if message else ""
                self._add(
                    rules.RAW_RAISE,
                    node,
                    f"raw {name} raised{excerpt}: its status depends on the "
                    "fallback mode (legacy 4xx/501, strict 500)",
                    rules.suggest_for_raise(name, message),
                    scope.qualname,
                )
        self.result.raises = dict(counts)

    def _check_handlers(self) -> None:
        for handler, scope in self._handlers:
            broad = [
                n for n in self._caught(handler.type) if n in rules.BROAD_CATCH_TYPES
            ]
            if not broad:
                continue
            for converted in _exits(handler.body):
                client = self._client_error(converted)
                if client is not None:
                    clause = (
                        "bare except"
                        if handler.type is None
                        else f"except {', '.join(broad)}"
                    )
                    self._add(
                        rules.BROAD_EXCEPT,
                        handler,
                        f"{clause} becomes {client}: internal failures "
                        "in the try block are reported as client errors",
                        "catch VLLMClientError; raise VLLMValidationError at the check",
                        scope,
                        code_node=handler.type,
                    )
                    break

    def _check_returns(self) -> None:
        for node, scope in self._returns:
            value = (
                node.value.value if isinstance(node.value, ast.Await) else node.value
            )
            if not isinstance(value, ast.Call):
                continue
            name = self._callee(value)
            if name in rules.ERROR_MODEL_BUILDERS:
                self._add(
                    rules.ERROR_RESPONSE,
                    node,
                    f"returns {name}(...): the HTTP status is left to the caller "
                    "(200 unless converted)",
                    rules.suggest_for_status(self._first_status(value)),
                    scope,
                )
            elif (
                name in rules.RESPONSE_CLASSES
                and _argument(value, rules.STATUS_CARRIERS[name]) is None
                and _is_error_body(_body_argument(value))
            ):
                self._add(
                    rules.ERROR_RESPONSE,
                    node,
                    f"returns an error {name} without status_code (sent as 200)",
                    rules.GENERIC_SUGGESTION,
                    scope,
                )

    def _check_expressions(
        self, roots: Iterator[tuple[ast.AST, str]], *, status_tokens: bool
    ) -> None:
        consumed: set[int] = set()
        for root, scope in roots:
            self._scope = scope
            for node in ast.walk(root):
                self._check_expression(node, consumed, status_tokens=status_tokens)

    def _check_expression(
        self, node: ast.AST, consumed: set[int], *, status_tokens: bool
    ) -> None:
        match node:
            case ast.Call() if self._is_http_exception(node.func):
                self._http_exception(node)
            case ast.Raise(exc=ast.Name() | ast.Attribute() as exc) if (
                self._is_http_exception(exc)
            ):
                self._http_exception(node)
            case _ if not status_tokens:
                return
            case ast.Call() if self._callee(node) in rules.STATUS_RANGE_CALLS:
                self._status_guess(node)
            case ast.BoolOp():
                consumed.update(self._bounded_pair(node))
            case ast.Compare() if id(node) not in consumed:
                if self._is_range_compare(node):
                    self._status_guess(node)
            case ast.Attribute() if node.attr in rules.STATUS_RANGE_ATTRIBUTES:
                self._status_guess(node)

    def _http_exception(self, node: ast.Call | ast.Raise) -> None:
        status = self._first_status(node) if isinstance(node, ast.Call) else None
        shown = f"HTTPException({status})" if status is not None else "HTTPException"
        self._add(
            rules.HTTP_EXC,
            node,
            f"{shown} outside vllm_omni/errors bypasses the one error renderer",
            rules.suggest_for_status(status),
            self._scope,
        )

    def _bounded_pair(self, node: ast.BoolOp) -> list[int]:
        """``x >= 400 and x < 500``: one finding for the pair of compares."""
        if not isinstance(node.op, ast.And):
            return []
        bounded: dict[str, list[ast.expr]] = {}
        for value in node.values:
            operand = self._bounded_operand(value)
            if operand is not None:
                bounded.setdefault(ast.dump(operand), []).append(value)
        for compares in bounded.values():
            if len(compares) >= 2:
                self._status_guess(node)
                return [id(compare) for compare in compares]
        return []

    def _bounded_operand(self, node: ast.expr) -> ast.expr | None:
        """``x`` of ``x < 500`` or ``400 <= x``; None for anything else."""
        if not (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], _ORDERING)
        ):
            return None
        left, right = node.left, node.comparators[0]
        if _status(right) in rules.STATUS_BOUNDS and _status(left) is None:
            return left
        if _status(left) in rules.STATUS_BOUNDS and _status(right) is None:
            return right
        return None

    def _is_range_compare(self, node: ast.Compare) -> bool:
        operands = [node.left, *node.comparators]
        if all(isinstance(op, _ORDERING) for op in node.ops):
            if len(operands) == 3:
                low, _, high = operands
                return (
                    _status(low) in rules.STATUS_BOUNDS
                    and _status(high) in rules.STATUS_BOUNDS
                )
            operand = self._bounded_operand(node)
            return operand is not None and _is_status_name(operand)
        if len(operands) != 2 or not isinstance(node.ops[0], _MEMBERSHIP):
            return False
        return any(
            _is_status_class(a, b) or _is_status_range(b)
            for a, b in (operands, operands[::-1])
        )

    def _status_guess(self, node: ast.expr) -> None:
        shown = ast.unparse(node)
        if len(shown) > _MESSAGE_EXCERPT:
            shown = shown[: _MESSAGE_EXCERPT - 3] + "..."
        self._add(
            rules.STATUS_RANGE,
            node,
            f"status range decides ownership: {shown}",
            "OmniErrorDetails.category",
            self._scope,
        )

    def _client_error(self, node: ast.expr) -> str | None:
        """How ``node`` (raised or returned) is a 4xx error, if it is."""
        for sub in ast.walk(node):
            if not isinstance(sub, ast.Call | ast.Name | ast.Attribute):
                continue
            name = self._callee(sub)
            if name in rules.CLIENT_ERROR_TYPES:
                return name
            carrier = rules.STATUS_CARRIERS.get(name)
            if carrier is not None and isinstance(sub, ast.Call):
                status = _carrier_status(sub, carrier)
                if status is not None and 400 <= status < 500:
                    return f"{name}({status})"
        return None

    def _first_status(self, node: ast.expr) -> int | None:
        """The status the first status-carrying call in ``node`` fixes."""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                carrier = rules.STATUS_CARRIERS.get(self._callee(sub))
                if carrier is not None:
                    status = _carrier_status(sub, carrier)
                    if status is not None:
                        return status
        return None

    # -- positions ----------------------------------------------------------

    def _add(
        self,
        rule: str,
        node: ast.stmt | ast.expr | ast.excepthandler,
        message: str,
        suggestion: str,
        scope: str,
        *,
        code_node: ast.expr | None = None,
    ) -> None:
        column = self._column(node.lineno, node.col_offset)
        if isinstance(node, ast.ExceptHandler):
            # The clause, not its body: editing the handler's body must not
            # make the site new.
            caught = "" if code_node is None else " " + self._source(code_node)
            code = f"except{caught}:"
        else:
            code = self._source(node)
        finding = Finding(rule, node.lineno, column, message, suggestion, scope, code)
        self.result.findings.append(finding)
        self._sites.append((finding, node))

    def _source(self, node: ast.AST) -> str:
        """``node``'s source without whitespace (a fingerprint input)."""
        lines = self._text_lines()
        first, last = node.lineno, node.end_lineno or node.lineno
        start, end = node.col_offset, node.end_col_offset
        if end is None or last > len(lines):
            return ""
        picked = [line.encode() for line in lines[first - 1 : last]]
        picked[-1] = picked[-1][:end]
        picked[0] = picked[0][start:]
        text = b"\n".join(picked).decode(errors="replace")
        # Without any whitespace: reformatting (``raise  X( 'a' )``) must not
        # make a site new, and two statements that differ only in spaces
        # are the same code.
        return "".join(text.split())[:_CODE_LIMIT]

    def _text_lines(self) -> list[str]:
        if self._lines is None:
            text = self._text if self._text is not None else _decode(self._data)
            self._lines = _split_lines(text)
        return self._lines

    def _column(self, line: int, byte_offset: int) -> int:
        """1-based column in UTF-16 code units (SARIF's default columnKind)."""
        lines = self._text_lines()
        text = lines[line - 1] if line <= len(lines) else ""
        if text.isascii():
            return min(byte_offset, len(text)) + 1
        prefix = text.encode()[:byte_offset].decode(errors="replace")
        return len(prefix.encode("utf-16-le")) // 2 + 1


# -- helpers without state ----------------------------------------------------


def _child(scope: str, name: str) -> str:
    return name if scope == MODULE_SCOPE else f"{scope}.{name}"


def _last(qualname: str | None) -> str:
    return "" if qualname is None else qualname.rpartition(".")[2]


def _decorators(stmt: ast.stmt) -> list[ast.expr]:
    return getattr(stmt, "decorator_list", [])


def _has(data: bytes, token: bytes, present: frozenset[str] | None) -> bool:
    """Whether ``token`` occurs in ``data``; from ``present`` (the skeleton's
    search, which covers every hot token) when given."""
    text = token.decode()
    if present is not None and text in _HOT_STATEMENT:
        return text in present
    return token in data


def _token_lines(data: bytes, tokens: tuple[bytes, ...]) -> list[int]:
    """Sorted 1-based numbers of the lines on which any of ``tokens`` occurs."""
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if _lexer is not None and len(tokens) <= _lexer.MAX_NEEDLES:
        (lines,), _ = _lexer.needle_lines(data, (tuple(t.decode() for t in tokens),))
        return lines
    positions: list[int] = []
    for token in tokens:
        start = data.find(token)
        while start >= 0:
            positions.append(start)
            start = data.find(token, start + 1)
    lines: list[int] = []
    line, previous = 1, 0
    for position in sorted(positions):
        line += data.count(b"\n", previous, position)
        previous = position
        lines.append(line)
    return lines


def _is_type_checking(test: ast.expr) -> bool:
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
    return name == "TYPE_CHECKING"


def _exits(body: list[ast.stmt]) -> Iterator[ast.expr]:
    """Expressions raised or returned by ``body``, outside nested scopes."""
    for stmt in body:
        if isinstance(stmt, ast.Raise | ast.Return):
            value = stmt.exc if isinstance(stmt, ast.Raise) else stmt.value
            if value is not None:
                yield value
        elif not isinstance(stmt, _NESTED_SCOPES):
            for name in ("body", "orelse", "finalbody"):
                yield from _exits(getattr(stmt, name, []))
            for part in getattr(stmt, "handlers", []) + getattr(stmt, "cases", []):
                yield from _exits(part.body)


def _argument(call: ast.Call, carrier: rules.StatusCarrier) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == carrier.keyword:
            return keyword.value
    positional = carrier.position
    if positional is not None and positional < len(call.args):
        candidate = call.args[positional]
        if not isinstance(candidate, ast.Starred):
            return candidate
    return None


def _carrier_status(call: ast.Call, carrier: rules.StatusCarrier) -> int | None:
    argument = _argument(call, carrier)
    return carrier.default if argument is None else _status(argument)


def _status(node: ast.expr) -> int | None:
    """An HTTP status literal: ``404``, ``HTTPStatus.NOT_FOUND(.value)``,
    ``status.HTTP_404_NOT_FOUND``, ``int(...)``/``HTTPStatus(...)`` of one."""
    if isinstance(node, ast.Constant):
        value = node.value
        return value if type(value) is int else None
    if isinstance(node, ast.Call):
        if len(node.args) == 1 and _last(_dotted(node.func)) in ("int", "HTTPStatus"):
            return _status(node.args[0])
        return None
    if isinstance(node, ast.Attribute) and node.attr == "value":
        return _status(node.value)
    name = _last(_dotted(node))
    if name.startswith("HTTP_") and name[5:8].isdigit():
        return int(name[5:8])
    if isinstance(node, ast.Attribute) and _last(_dotted(node.value)) == "HTTPStatus":
        member = HTTPStatus.__members__.get(node.attr)
        return None if member is None else member.value
    return None


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _is_status_name(node: ast.expr) -> bool:
    while isinstance(node, ast.Call) and len(node.args) == 1:
        node = node.args[0]
    name = _last(_dotted(node)).lower()
    return any(marker in name for marker in rules.STATUS_NAME_MARKERS)


def _is_status_class(left: ast.expr, right: ast.expr) -> bool:
    """``status // 100 == 4`` or ``status // 100 in (4, 5)``."""
    if not (
        isinstance(left, ast.BinOp)
        and isinstance(left.op, ast.FloorDiv)
        and _status(left.right) == 100
    ):
        return False
    digits = (
        right.elts if isinstance(right, ast.Tuple | ast.List | ast.Set) else [right]
    )
    return any(_status(digit) in rules.STATUS_CLASS_DIGITS for digit in digits)


def _is_status_range(node: ast.expr) -> bool:
    """``range(400, 500)`` on the right of ``in``."""
    return (
        isinstance(node, ast.Call)
        and _last(_dotted(node.func)) == "range"
        and bool(node.args)
        and _status(node.args[0]) in rules.STATUS_BOUNDS
    )


def _body_argument(call: ast.Call) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == "content":
            return keyword.value
    return call.args[0] if call.args else None


def _is_error_body(node: ast.expr | None) -> bool:
    if node is None:
        return False
    for sub in ast.walk(node):
        if isinstance(sub, ast.Dict):
            for key in sub.keys:
                if isinstance(key, ast.Constant) and key.value in rules.ERROR_BODY_KEYS:
                    return True
        name = sub.id if isinstance(sub, ast.Name) else getattr(sub, "attr", None)
        if isinstance(name, str):
            lowered = name.lower()
            if "error" in lowered or lowered in rules.ERROR_IDENTIFIERS:
                return True
    return False


def _message_literal(node: ast.expr) -> str:
    """The literal text of a raise's first argument; f-string holes as {...}."""
    if not isinstance(node, ast.Call) or not node.args:
        return ""
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        text = first.value
    elif isinstance(first, ast.JoinedStr):
        text = "".join(
            part.value if isinstance(part, ast.Constant) else "{...}"
            for part in first.values
        )
    else:
        return ""
    return " ".join(text.split())


def _decode(data: bytes) -> str:
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding, errors="replace")


def _split_lines(text: str) -> list[str]:
    # The tokenizer's line breaks, not str.splitlines' (which also breaks at
    # form feeds and other characters Python treats as whitespace).
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _parse_error(data: bytes, exc: BaseException) -> Finding:
    rule = rules.RULES_BY_ID[rules.PARSE_ERROR]
    undecodable = _decode_error(data)
    if undecodable is not None:
        return undecodable
    if isinstance(exc, SyntaxError):
        line, column = exc.lineno or 1, max(exc.offset or 1, 1)
        message = f"syntax error: {exc.msg}"
    elif isinstance(exc, ValueError):
        line = data.count(b"\n", 0, max(data.find(b"\0"), 0)) + 1
        column, message = 1, f"cannot parse: {exc}"
    else:
        line, column = 1, 1
        message = f"cannot parse: {type(exc).__name__} (nested too deeply)"
    return Finding(rule.id, line, column, message, rule.help)


def _decode_error(data: bytes) -> Finding | None:
    """An OMNI000 finding when ``data`` does not decode, else None."""
    rule = rules.RULES_BY_ID[rules.PARSE_ERROR]
    problem = None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        # An unknown or unusable declaration, or bad bytes in the first two
        # lines: locate bad bytes as UTF-8, else report the declaration.
        encoding, problem = "utf-8", exc.msg
    try:
        data.decode(encoding)
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        prefix = data[line_start : exc.start].decode(encoding, errors="replace")
        return Finding(
            rule.id,
            data.count(b"\n", 0, exc.start) + 1,
            len(prefix.encode("utf-16-le")) // 2 + 1,
            f"undecodable as {encoding}: byte 0x{data[exc.start]:02x} ({exc.reason})",
            rule.help,
        )
    if problem is not None:
        return Finding(rule.id, 1, 1, f"undecodable: {problem}", rule.help)
    return None
