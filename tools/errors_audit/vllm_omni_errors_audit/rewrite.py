"""The migration assistant's decisions: which findings can be rewritten, how,
and why the others cannot.

Owns the plan for one file. ``--fix`` rewrites what needs no judgement:

- OMNI005 ``raise HTTPException(status, detail)`` with a literal error
  status -> ``raise <Type>(detail)`` (``rules.semantic_type_for_status``:
  the semantic type of the status, else ``OmniClientError``/
  ``OmniServerError`` with ``status_code=``), its ``from`` clause kept,
  once ``flow`` has followed the exception to where it is answered and
  found the new type goes the same way (widening the except clauses that
  let HTTPException alone through);
- OMNI003 an error ``JSONResponse`` (any response class) returned without a
  status -> the same with ``status_code=<its error's literal code>``; an
  error model (``ErrorResponse``, ``create_error_response(...)``) returned
  by a route, which FastAPI would send as 200 -> ``JSONResponse(content=
  jsonable_encoder(<it>), status_code=<its code>)`` (the body FastAPI would
  have sent, with its status);
- OMNI004 a status-range guess on ``<record>.status_code``, where the record
  is an ``OmniErrorDetails`` -> ``<record>.category == "client"`` (or
  ``"server"``): the guess is evaluated on every status 400-599 and must be
  exactly one category.

``--suggest`` proposes what needs a person:

- OMNI001 a raw raise at a request boundary (a function taking an API
  request model, a route, a request model's own method) -> the type the
  audit suggests, the message kept, ``parameter=`` where the message names
  a field of that request model;
- OMNI002 a broad ``except`` turned into a 4xx -> ``except VLLMClientError``,
  where every raise site of its ``try`` body is a client type (after this
  plan's own suggestions) and there is at least one.

No rewrite changes which ``except`` clause of its function catches a
raise, and a suggestion never makes a handler a new OMNI002. Where an
``HTTPException`` goes beyond its function is ``flow``'s: the plan takes
its verdict per site. Everything else is a ``Skip`` with its reason. A
rewrite needs the names it raises: a name bound in the file to something
else blocks it.

Stdlib only (``ast``); ``codemod`` performs the plan with LibCST.
"""

from __future__ import annotations

import ast
import builtins
import io
import os
import re
import tokenize
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from itertools import pairwise
from pathlib import Path
from typing import Literal

from vllm_omni_errors_audit import rules
from vllm_omni_errors_audit.runner import (
    ReportedFinding,
    SourceFile,
    _Unreadable,
    file_findings,
    read_regular,
)
from vllm_omni_errors_audit.scanner import (
    _argument,
    _body_argument,
    _dotted,
    _last,
    _Scanner,
    _status,
    whole_scan,
)

# ``fix``: rewrites that keep every status a client sees (``--fix``);
# ``unsafe``: the same findings' rewrites that may change one, applied only
# with ``--unsafe-fixes`` (ruff's split); ``suggest``: a person's patch.
Kind = Literal["fix", "unsafe", "suggest"]
_MECHANICAL = frozenset({rules.ERROR_RESPONSE, rules.STATUS_RANGE, rules.HTTP_EXC})
KIND_RULES: dict[Kind, frozenset[str]] = {
    "fix": _MECHANICAL,
    "unsafe": _MECHANICAL,
    "suggest": frozenset({rules.RAW_RAISE, rules.BROAD_EXCEPT}),
}
CLIENT_BASE = "VLLMClientError"
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_STRUCTURED = (
    ast.Dict,
    ast.List,
    ast.Set,
    ast.Tuple,
    ast.DictComp,
    ast.ListComp,
    ast.SetComp,
    ast.GeneratorExp,
)
# Shared leaf nodes without a position (``Load()``, ``Add()``, ...).
_TOKENS = (ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUOTES = "'\"`"
_MODEL_DEPTH = 4


# -- what a rewrite does (``codemod`` reads these) ----------------------------


@dataclass(frozen=True, slots=True)
class RaiseSemantic:
    """``raise HTTPException(...)`` -> ``raise <type_name>(<message>)``: the
    call's arguments (positional then keyword, in source order) are indexed;
    ``detail`` is None when the message is Starlette's default phrase."""

    type_name: str
    status: int
    detail: int | None
    message: str
    # The status the type takes as ``status_code=`` (OmniClientError,
    # OmniServerError: a status with no semantic type of its own), or None.
    explicit: int | None = None


@dataclass(frozen=True, slots=True)
class AddStatus:
    """``return Response(...)`` -> the same call with ``status_code=status``."""

    status: int


@dataclass(frozen=True, slots=True)
class WrapModel:
    """``return <model>`` in a route -> ``return JSONResponse(content=
    jsonable_encoder(<model>), status_code=status)``."""

    status: int


@dataclass(frozen=True, slots=True)
class RaiseModel:
    """``return create_error_response(msg[, err_type, status])`` in a
    function that is not a route -> ``raise <type_name>(msg)`` (an unsafe
    fix: the caller that set the status from the model now gets an
    exception)."""

    type_name: str
    # The status the type takes as ``status_code=``, or None.
    explicit: int | None = None


@dataclass(frozen=True, slots=True)
class UseCategory:
    """A status-range guess -> ``<record>.category == "<category>"``."""

    record: ast.expr
    category: str
    # The guess sits where a comparison must be parenthesized.
    parenthesize: bool


@dataclass(frozen=True, slots=True)
class RenameRaise:
    """``raise ValueError(msg)`` -> ``raise <type_name>(msg[, parameter=...])``."""

    type_name: str
    parameter: str | None


@dataclass(frozen=True, slots=True)
class NarrowExcept:
    """``except <broad>`` -> ``except VLLMClientError``: ``broad`` indexes the
    caught tuple's broad members (empty for a single name or a bare except)."""

    broad: tuple[int, ...]


Action = (
    RaiseSemantic
    | AddStatus
    | WrapModel
    | RaiseModel
    | UseCategory
    | RenameRaise
    | NarrowExcept
)


@dataclass(frozen=True, slots=True)
class Rewrite:
    """One finding's rewrite: its node's source span is rewritten."""

    finding: ReportedFinding
    kind: Kind
    action: Action
    node: ast.AST
    # (module, name) the new code needs and the file does not bind yet.
    imports: tuple[tuple[str, str], ...]
    # Names the old code used that may be unused afterwards (their imports
    # go when nothing uses them any more).
    unbinds: tuple[str, ...]
    description: str
    # The except clauses (in this file or others) that must let the new
    # type through before this rewrite keeps its raise's way (``flow``).
    needs: frozenset[Clause] = frozenset()


@dataclass(frozen=True, slots=True, order=True)
class Clause:
    """An except clause that lets HTTPException through and not the types
    --fix raises, which --fix widens: the handler's position (``ast``'s
    line and column) and how a person reads it."""

    path: Path
    line: int
    column: int
    shown: str


@dataclass(frozen=True, slots=True)
class Way:
    """Where one HTTPException site's exception goes (``flow``): why a
    semantic type raised there would go elsewhere (None: it would not),
    and the clauses to widen so it does not."""

    blocked: str | None = None
    widen: frozenset[Clause] = frozenset()


@dataclass(frozen=True, slots=True)
class Widen:
    """``except HTTPException`` -> ``except (HTTPException, VLLMError)``
    (a tuple gets ``VLLMError`` after ``HTTPException``)."""

    clause: Clause
    handler: ast.ExceptHandler
    # The element of a caught tuple that VLLMError follows.
    after: int | None
    imports: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Skip:
    """A finding of a rewritable rule that is left to a person, and why."""

    finding: ReportedFinding
    reason: str


@dataclass(slots=True)
class FilePlan:
    """One file's text and tree, its rewrites and what was left."""

    source: SourceFile
    data: bytes
    text: str
    encoding: str
    tree: ast.Module
    # Every finding of the file (allowlisted ones too), by fingerprint.
    fingerprints: frozenset[str]
    rewrites: list[Rewrite] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    # The clauses of this file --fix widens (for rewrites here or in other
    # files), and those it was asked to widen and cannot (a run with any
    # of those writes nothing).
    widen: list[Widen] = field(default_factory=list)
    unwidened: list[str] = field(default_factory=list)


def plan_file(
    source: SourceFile,
    findings: Sequence[ReportedFinding],
    kinds: frozenset[Kind],
    models: ModelIndex,
    ways: Mapping[str, Way] | None = None,
    widen: Sequence[Clause] = (),
) -> FilePlan | list[Skip]:
    """The plan for ``findings`` (reported, not allowlisted, of one file) of
    the rules ``kinds`` rewrite; a list of skips when the file cannot be
    rewritten at all (unreadable, or it does not parse whole). ``ways``:
    ``flow``'s verdict on each HTTPException site, by fingerprint (None:
    not traced, so none is rewritten); ``widen``: this file's clauses to
    widen."""
    wanted = frozenset().union(*(KIND_RULES[kind] for kind in kinds))
    targets = [f for f in findings if f.rule in wanted]
    try:
        data = read_regular(source.path)
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)
        tree = ast.parse(data)
        scanner = whole_scan(data, tree)
    except _Unreadable as exc:
        return [Skip(f, exc.reason) for f in targets]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return [
            Skip(f, "the file does not parse as a whole, so it is never rewritten")
            for f in targets
        ]
    sites = scanner.sites()
    reported = file_findings(source, [finding for finding, _ in sites])
    nodes = {r.fingerprint: sites[index][1] for index, r in reported}
    plan = FilePlan(source, data, text, encoding, tree, frozenset(nodes))
    context = _Context(plan, scanner, models, ways or {}, unsafe="unsafe" in kinds)
    for clause in widen:
        _add_widen(plan, context, clause)
    suggested: list[tuple[ReportedFinding, ast.AST]] = []
    for finding in targets:
        node = nodes.get(finding.fingerprint)
        if node is None:
            plan.skipped.append(Skip(finding, "the file changed since it was audited"))
        elif finding.rule in KIND_RULES["suggest"]:
            suggested.append((finding, node))
        else:
            _add(plan, context.fix(finding, node))
    for outcome in context.suggest(suggested):
        _add(plan, outcome)
    plan.rewrites.sort(key=lambda r: (r.finding.line, r.finding.column))
    return plan


def _add_widen(plan: FilePlan, context: _Context, clause: Clause) -> None:
    handler = handler_at(plan.tree, clause.line, clause.column)
    if handler is None:
        plan.unwidened.append(f"{clause.shown}: the clause is not in the file")
        return
    after = widen_position(handler, module_bindings(plan.tree))
    if isinstance(after, str):
        plan.unwidened.append(f"{clause.shown}: {after}")
        return
    needed = context._import(
        rules.FIX_BASE, rules.ERRORS_MODULE, rules.SEMANTIC_SOURCES
    )
    if isinstance(needed, str):
        plan.unwidened.append(f"{clause.shown}: {needed}")
        return
    plan.widen.append(Widen(clause, handler, after, needed))


def _add(plan: FilePlan, outcome: Rewrite | Skip) -> None:
    if isinstance(outcome, Skip):
        plan.skipped.append(outcome)
    else:
        plan.rewrites.append(outcome)


@dataclass(frozen=True, slots=True)
class _Boundary:
    """Where a raise meets a request: the name its request is reachable by
    (``request``, ``self`` in a model), and the model's fields if known."""

    name: str | None
    fields: frozenset[str] | None


class _NotStatic(Exception):
    """A status-range guess that cannot be evaluated without running code."""


class _Context:
    """The analysis of one file the rewrites share."""

    def __init__(
        self,
        plan: FilePlan,
        scanner: _Scanner,
        models: ModelIndex,
        ways: Mapping[str, Way],
        *,
        unsafe: bool = False,
    ) -> None:
        self._plan = plan
        # Rewrite too what would change a status (``--unsafe-fixes``).
        self._unsafe = unsafe
        self._scanner = scanner
        self._models = models
        self._ways = ways
        tree = plan.tree
        # Parents of the nodes on the paths to the findings' nodes, found on
        # demand (a parent map of a whole large file costs more than a plan).
        self._parents: dict[ast.AST, ast.AST] = {}
        self._bindings = module_bindings(tree)
        # Handlers that are OMNI002 findings already (one more client error
        # raised in them adds no finding).
        self._converting = {
            node
            for finding, node in scanner.sites()
            if finding.rule == rules.BROAD_EXCEPT
        }
        self._web = any(
            origin.partition(".")[0] in rules.WEB_FRAMEWORKS
            for origin in self._bindings.values()
        )

    def _parent(self, node: ast.AST) -> ast.AST | None:
        if node is self._plan.tree:
            return None
        if node not in self._parents:
            path = _path(self._plan.tree, node)
            if path is None:
                return None
            for parent, child in pairwise([self._plan.tree, *path]):
                self._parents[child] = parent
        return self._parents.get(node)

    # -- --fix ------------------------------------------------------------

    def fix(self, finding: ReportedFinding, node: ast.AST) -> Rewrite | Skip:
        if finding.rule == rules.HTTP_EXC:
            return self._http_exception(finding, node)
        if finding.rule == rules.ERROR_RESPONSE:
            return self._error_response(finding, node)
        return self._status_range(finding, node)

    def _http_exception(
        self, finding: ReportedFinding, node: ast.AST
    ) -> Rewrite | Skip:
        site = http_exception_site(node, self._parent(node))
        if isinstance(site, str):
            return Skip(finding, site)
        way = self._ways.get(finding.fingerprint)
        blocked = (
            "where its exception goes was not followed" if way is None else way.blocked
        )
        if blocked is not None and not self._unsafe:
            return Skip(finding, blocked)
        type_name, status = site.action.type_name, site.code
        needed = self._import(type_name, rules.ERRORS_MODULE, rules.SEMANTIC_SOURCES)
        if isinstance(needed, str):
            return Skip(finding, needed)
        assert isinstance(node, ast.Call)
        description = f"raise {type_name} instead of HTTPException({status})"
        return Rewrite(
            finding,
            "fix" if blocked is None else "unsafe",
            site.action,
            node,
            needed,
            _names(node.func, site.status_node),
            description if blocked is None else f"{description}; unsafe: {blocked}",
            frozenset() if way is None or blocked is not None else way.widen,
        )

    def _error_response(
        self, finding: ReportedFinding, node: ast.AST
    ) -> Rewrite | Skip:
        assert isinstance(node, ast.Return) and node.value is not None
        value = node.value.value if isinstance(node.value, ast.Await) else node.value
        assert isinstance(value, ast.Call)
        name = self._scanner.callee(value)
        status = self._error_code(
            value if name in rules.ERROR_MODEL_BUILDERS else _body_argument(value),
            self._caught_names(node),
        )
        if isinstance(status, str):
            return Skip(finding, status)
        if name in rules.RESPONSE_CLASSES:
            return Rewrite(
                finding,
                "fix",
                AddStatus(status),
                value,
                (),
                (),
                f"send the {name} with its error's status {status}",
            )
        if not self._is_route(self._function(node)):
            reason = (
                "the error model goes to a caller that sets the status from it; "
                "raising instead changes what that caller catches"
            )
            if not self._unsafe:
                return Skip(finding, reason)
            return self._raise_model(finding, node, value, name, status, reason)
        needed: list[tuple[str, str]] = []
        for wrapper in ("JSONResponse", "jsonable_encoder"):
            module, sources = rules.RESPONSE_IMPORTS[wrapper]
            more = self._import(wrapper, module, sources)
            if isinstance(more, str):
                return Skip(finding, more)
            needed += more
        return Rewrite(
            finding,
            "fix",
            WrapModel(status),
            node,
            tuple(needed),
            (),
            f"send the route's {name} as a JSONResponse with status {status}",
        )

    def _raise_model(
        self,
        finding: ReportedFinding,
        node: ast.Return,
        call: ast.Call,
        name: str | None,
        status: int,
        reason: str,
    ) -> Rewrite | Skip:
        """``return create_error_response(msg, ...)`` -> ``raise <type>(msg)``
        (``--unsafe-fixes``): the type of its status, its message kept."""
        if name != "create_error_response":
            return Skip(finding, f"{reason}; {name}(...) has no message to raise")
        if node.value is not call:
            return Skip(finding, f"{reason}; the call is awaited")
        message = _message_argument(call)
        known = {"message", "err_type", "status_code"}
        if (
            message is None
            or any(isinstance(a, ast.Starred) for a in call.args)
            or len(call.args) > 3
            or any(k.arg not in known for k in call.keywords)
        ):
            return Skip(
                finding,
                f"{reason}; its arguments are not a message, a type and a status",
            )
        chosen = rules.semantic_type_for_status(status)
        assert chosen is not None  # _error_code gives 400-599 only
        type_name, explicit = chosen
        needed = self._import(type_name, rules.ERRORS_MODULE, rules.SEMANTIC_SOURCES)
        if isinstance(needed, str):
            return Skip(finding, needed)
        return Rewrite(
            finding,
            "unsafe",
            RaiseModel(type_name, status if explicit else None),
            node,
            needed,
            (),
            f"raise {type_name} instead of returning the error model "
            f"(status {status}); unsafe: {reason}",
        )

    def _caught_names(self, node: ast.AST) -> frozenset[str]:
        """The names the except clauses around ``node`` bind (``as exc``)."""
        names: set[str] = set()
        parent = self._parent(node)
        while parent is not None and not isinstance(parent, _SCOPES):
            if isinstance(parent, ast.ExceptHandler) and parent.name:
                names.add(parent.name)
            parent = self._parent(parent)
        return frozenset(names)

    def _error_code(self, body: ast.expr | None, caught: frozenset[str]) -> int | str:
        """The one literal error status in a response body, or why not;
        ``caught``: names bound to a caught exception where the body is."""
        statuses: set[int] = set()
        unknown = False
        for sub in ast.walk(body) if body is not None else ():
            code: ast.expr | None = None
            if isinstance(sub, ast.Dict):
                for key, item in zip(sub.keys, sub.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "code":
                        code = item
            elif isinstance(sub, ast.Call):
                callee = self._scanner.callee(sub)
                carrier = rules.STATUS_CARRIERS.get(callee)
                message = _message_argument(sub)
                if (
                    callee == "create_error_response"
                    and isinstance(message, ast.Name)
                    and message.id in caught
                ):
                    # Given an exception, vLLM's create_error_response
                    # takes the status from its type, whatever else it is
                    # given.
                    return (
                        f"its status comes from the type of the exception it "
                        f"is built from (create_error_response({message.id}))"
                    )
                if callee in rules.ERROR_MODEL_BUILDERS | {"ErrorInfo"} and carrier:
                    code = _argument(sub, carrier)
                    if code is None and carrier.default is not None:
                        statuses.add(carrier.default)
                        continue
            if code is None:
                continue
            status = _status(code)
            if status is None or not 400 <= status <= 599:
                unknown = True
            else:
                statuses.add(status)
        if unknown:
            return "its error's code is not a literal status"
        if len(statuses) != 1:
            return (
                "its body has no error code"
                if not statuses
                else "its body names several error codes"
            )
        return statuses.pop()

    def _status_range(self, finding: ReportedFinding, node: ast.AST) -> Rewrite | Skip:
        assert isinstance(node, ast.expr)
        operands = list(_status_operands(node))
        if not operands or not all(
            self._is_record(operand.value, node) for operand in operands
        ):
            return Skip(
                finding, "the status does not come from an OmniErrorDetails record"
            )
        shapes = {ast.dump(operand) for operand in operands}
        if len(shapes) > 1:
            return Skip(finding, "it compares more than one status")
        (shape,) = shapes
        try:
            truth = frozenset(
                status for status in range(400, 600) if _evaluate(node, shape, status)
            )
        except (_NotStatic, RecursionError):
            return Skip(finding, "the guess is not a comparison of literals")
        category = next(
            (
                c
                for c, statuses in rules.RECORD_CATEGORIES.items()
                if truth == set(statuses)
            ),
            None,
        )
        if category is None:
            return Skip(finding, "the guess does not split client from server")
        record = operands[0].value
        kept = _names(record)
        return Rewrite(
            finding,
            "fix",
            UseCategory(record, category, self._needs_parentheses(node)),
            node,
            (),
            tuple(name for name in _names(node) if name not in kept),
            f'read the record\'s category ("{category}") instead of its status',
        )

    def _is_record(self, node: ast.expr, at: ast.AST) -> bool:
        """Whether ``node`` is a name every binding of which, in its function
        (or the module), is an ``OmniErrorDetails``."""
        if not isinstance(node, ast.Name):
            return False
        function = self._function(at)
        for scope in (function, None) if function is not None else (None,):
            verdicts = list(self._record_bindings(scope, node.id))
            if verdicts:
                return all(verdicts)
        return False

    def _record_bindings(self, scope: ast.AST | None, name: str) -> Iterator[bool]:
        """For each binding of ``name`` in ``scope`` (None: the module):
        whether it binds an ``OmniErrorDetails``."""
        if isinstance(scope, _FUNCTIONS):
            arguments = scope.args
            for argument in (
                *arguments.posonlyargs,
                *arguments.args,
                *arguments.kwonlyargs,
            ):
                if argument.arg == name:
                    yield _mentions(argument.annotation, rules.RECORD_TYPE)
            body = scope.body
        else:
            body = self._plan.tree.body
        for stmt in _statements(body):
            for target in _stored_names(stmt):
                if target != name:
                    continue
                if isinstance(stmt, ast.AnnAssign):
                    yield _mentions(stmt.annotation, rules.RECORD_TYPE)
                elif isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
                    yield self._builds_record(stmt.value)
                else:
                    yield False

    def _builds_record(self, call: ast.Call) -> bool:
        qualname = self._scanner._qualname(call.func) or ""
        return _last(qualname) in rules.RECORD_BUILDERS and (
            qualname.startswith(rules.ERRORS_MODULE + ".")
            or qualname.partition(".")[0] == rules.RECORD_TYPE
        )

    def _needs_parentheses(self, node: ast.expr) -> bool:
        parent = self._parent(node)
        if isinstance(node, ast.Compare):
            return isinstance(parent, ast.Compare | ast.BinOp | ast.UnaryOp) and not (
                isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not)
            )
        return not (
            isinstance(parent, ast.BoolOp | ast.stmt | ast.keyword | ast.IfExp)
            or (isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not))
            or (isinstance(parent, ast.Call) and node in parent.args)
        )

    # -- --suggest ----------------------------------------------------------

    def suggest(
        self, findings: list[tuple[ReportedFinding, ast.AST]]
    ) -> Iterator[Rewrite | Skip]:
        """Raw raises and broad excepts, decided together: a raise's new type
        may make its ``try`` all-client, a narrowed except may catch it."""
        raises: dict[ast.AST, Rewrite] = {}
        handlers: dict[ast.AST, tuple[ReportedFinding, tuple[int, ...]]] = {}
        for finding, node in findings:
            if finding.rule == rules.RAW_RAISE:
                outcome = self._raw_raise(finding, node)
                if isinstance(outcome, Skip):
                    yield outcome
                else:
                    raises[node] = outcome
            else:
                assert isinstance(node, ast.ExceptHandler)
                broad = self._broad_members(node)
                if isinstance(broad, str):
                    yield Skip(finding, broad)
                else:
                    handlers[node] = (finding, broad)
        suggested = dict(raises)
        while True:
            narrowed = {
                handler: broad
                for handler, (_, broad) in handlers.items()
                if self._unclient(handler, suggested) is None
            }
            kept = {
                node: rewrite
                for node, rewrite in suggested.items()
                if self._flow(node, rewrite, narrowed) is None
            }
            if len(kept) == len(suggested):
                break
            suggested = kept
        for node, rewrite in raises.items():
            if node in suggested:
                yield rewrite
            else:
                reason = self._flow(node, rewrite, narrowed)
                yield Skip(rewrite.finding, reason or "")
        for handler, (finding, broad) in handlers.items():
            if handler not in narrowed:
                yield Skip(finding, self._unclient(handler, suggested) or "")
                continue
            needed = self._import(
                CLIENT_BASE, rules.ERRORS_MODULE, rules.SEMANTIC_SOURCES
            )
            if isinstance(needed, str):
                yield Skip(finding, needed)
                continue
            assert isinstance(handler, ast.ExceptHandler)
            dropped = (
                [handler.type]
                if handler.type is not None and not broad
                else [e for i, e in enumerate(_elements(handler.type)) if i in broad]
            )
            yield Rewrite(
                finding,
                "suggest",
                NarrowExcept(broad),
                handler,
                needed,
                _names(*dropped),
                f"catch {CLIENT_BASE}: every raise in the try body is a client error",
            )

    def _raw_raise(self, finding: ReportedFinding, node: ast.AST) -> Rewrite | Skip:
        assert isinstance(node, ast.Raise)
        exc = node.exc
        if not isinstance(exc, ast.Call):
            return Skip(finding, "raised without a message")
        if len(exc.args) != 1 or exc.keywords or isinstance(exc.args[0], ast.Starred):
            return Skip(finding, "it is not raised with exactly one message")
        type_name = finding.suggestion
        if type_name not in rules.SEMANTIC_PARENTS:
            return Skip(finding, f"no single semantic type is suggested ({type_name})")
        boundary = self._boundary(node)
        if boundary is None:
            return Skip(
                finding,
                "not at a request boundary: an internal check stays a server "
                "error (RuntimeError), which a person decides",
            )
        parameter = (
            _named_field(exc.args[0], boundary)
            if type_name in rules.PARAMETER_TYPES
            else None
        )
        needed = self._import(type_name, rules.ERRORS_MODULE, rules.SEMANTIC_SOURCES)
        if isinstance(needed, str):
            return Skip(finding, needed)
        raw = self._scanner.callee(exc)
        named = "" if parameter is None else f" naming parameter {parameter!r}"
        return Rewrite(
            finding,
            "suggest",
            RenameRaise(type_name, parameter),
            node,
            needed,
            tuple(n for n in _names(exc.func) if not hasattr(builtins, n)),
            f"raise {type_name} instead of {raw}{named}",
        )

    def _broad_members(self, handler: ast.ExceptHandler) -> tuple[int, ...] | str:
        caught = handler.type
        if caught is None:
            return ()
        if isinstance(caught, ast.Tuple):
            if not all(isinstance(e, ast.Name | ast.Attribute) for e in caught.elts):
                return "its caught types are not all names"
            return tuple(
                index
                for index, element in enumerate(caught.elts)
                if self._scanner.callee(element) in rules.BROAD_CATCH_TYPES
            )
        if isinstance(caught, ast.Name) and caught.id in self._scanner._tuple_bindings:
            return "its caught types come from a name bound elsewhere"
        if not isinstance(caught, ast.Name | ast.Attribute):
            return "its caught types are not a name or a tuple of names"
        return ()

    def _unclient(
        self, handler: ast.AST, suggested: dict[ast.AST, Rewrite]
    ) -> str | None:
        """Why ``handler``'s try body is not all client raises, or None."""
        body = self._parent(handler)
        assert isinstance(body, ast.Try | ast.TryStar)
        sites = [n for n in _walk(body.body) if isinstance(n, ast.Raise)]
        if not sites:
            return (
                "its try body raises nothing itself: what it catches comes from "
                "calls, which a person checks"
            )
        for site in sites:
            if site.exc is None:
                return f"the try body re-raises (line {site.lineno})"
            name = self._scanner.callee(site.exc)
            rewrite = suggested.get(site)
            if rewrite is not None:
                assert isinstance(rewrite.action, RenameRaise)
                name = rewrite.action.type_name
            if CLIENT_BASE not in rules.ancestors(name) and name not in (
                rules.CLIENT_ERROR_TYPES
            ):
                return (
                    f"the try body raises {name} (line {site.lineno}), "
                    "not a client type"
                )
        return None

    def _flow(
        self,
        node: ast.AST,
        rewrite: Rewrite,
        narrowed: dict[ast.AST, tuple[int, ...]],
    ) -> str | None:
        """Why the suggested type would be caught elsewhere in its function
        than the raw one, or would turn a broad handler into OMNI002."""
        assert isinstance(node, ast.Raise) and isinstance(rewrite.action, RenameRaise)
        assert node.exc is not None
        new = rewrite.action.type_name
        moved = self._caught_elsewhere(
            node, self._scanner.callee(node.exc), new, narrowed
        )
        if moved is not None or CLIENT_BASE not in rules.ancestors(new):
            return moved
        parent = self._parent(node)
        while parent is not None and not isinstance(parent, _SCOPES):
            if (
                isinstance(parent, ast.ExceptHandler)
                and parent not in self._converting
                and self._broad(parent, narrowed)
            ):
                return (
                    f"a client error raised in {self._clause(parent)} would make "
                    "that broad except an OMNI002 finding"
                )
            parent = self._parent(parent)
        return None

    def _caught_elsewhere(
        self,
        node: ast.Raise,
        old_name: str,
        new_name: str,
        narrowed: dict[ast.AST, tuple[int, ...]],
    ) -> str | None:
        """Why raising ``new_name`` instead of ``old_name`` at ``node`` would
        reach another ``except`` clause of its function (the old type meets
        the handlers as written, the new one as ``narrowed`` leaves them);
        None when the same clause, or none, catches both."""
        old, new = rules.ancestors(old_name), rules.ancestors(new_name)
        child: ast.AST = node
        parent = self._parent(child)
        while parent is not None and not isinstance(parent, _SCOPES):
            if isinstance(parent, ast.Try | ast.TryStar) and any(
                child is stmt for stmt in parent.body
            ):
                first_old = self._first_catching(parent, old, {})
                first_new = self._first_catching(parent, new, narrowed)
                if first_old is not first_new:
                    where = first_old if first_old is not None else first_new
                    assert where is not None
                    return (
                        f"its try's {self._clause(where)} catches one of "
                        f"{old_name} and {new_name}, not both"
                    )
                if first_old is not None:
                    return None
            child, parent = parent, self._parent(parent)
        return None

    def _clause(self, handler: ast.ExceptHandler) -> str:
        """``except A, B`` (as written, names resolved), ``except:``."""
        if handler.type is None:
            return "except:"
        return "except " + ", ".join(self._scanner._caught(handler.type))

    def _caught(
        self, handler: ast.ExceptHandler, narrowed: dict[ast.AST, tuple[int, ...]]
    ) -> frozenset[str] | None:
        """The names ``handler`` catches after narrowing; None for bare."""
        if handler in narrowed:
            broad = narrowed[handler]
            kept = [
                self._scanner.callee(e)
                for i, e in enumerate(_elements(handler.type))
                if handler.type is not None and broad and i not in broad
            ]
            return frozenset({*kept, CLIENT_BASE})
        if handler.type is None:
            return None
        return frozenset(self._scanner._caught(handler.type))

    def _first_catching(
        self,
        body: ast.Try | ast.TryStar,
        chain: frozenset[str],
        narrowed: dict[ast.AST, tuple[int, ...]],
    ) -> ast.ExceptHandler | None:
        for handler in body.handlers:
            caught = self._caught(handler, narrowed)
            if caught is None or caught & chain:
                return handler
        return None

    def _broad(
        self, handler: ast.ExceptHandler, narrowed: dict[ast.AST, tuple[int, ...]]
    ) -> bool:
        caught = self._caught(handler, narrowed)
        return caught is None or bool(caught & rules.BROAD_CATCH_TYPES)

    def _boundary(self, node: ast.AST) -> _Boundary | None:
        """The request a raise sits at: the innermost enclosing function that
        takes an API request model or is a route, else a request model's own
        method."""
        parent = self._parent(node)
        while parent is not None:
            if isinstance(parent, _FUNCTIONS):
                found = self._request_argument(parent)
                if found is not None:
                    return found
                if self._is_route(parent):
                    return _Boundary(None, None)
            elif isinstance(parent, ast.ClassDef):
                fields = _fields(parent)
                if parent.name.endswith("Request") and fields:
                    return _Boundary(
                        "self",
                        self._models.fields(
                            self._plan.source.path, self._plan.tree, parent.name
                        ),
                    )
                return None
            parent = self._parent(parent)
        return None

    def _request_argument(
        self, function: ast.FunctionDef | ast.AsyncFunctionDef
    ) -> _Boundary | None:
        arguments = function.args
        for argument in (
            *arguments.posonlyargs,
            *arguments.args,
            *arguments.kwonlyargs,
        ):
            for model in _request_models(argument.annotation):
                origin = self._bindings.get(model, "")
                protocol = any(
                    part.startswith("protocol") for part in origin.split(".")[:-1]
                )
                if argument.arg == "request" or protocol:
                    return _Boundary(
                        argument.arg,
                        self._models.fields(
                            self._plan.source.path, self._plan.tree, model
                        ),
                    )
        return None

    def _is_route(self, function: ast.AST | None) -> bool:
        if not self._web or not isinstance(function, _FUNCTIONS):
            return False
        return any(
            isinstance(decorator, ast.Call)
            and isinstance(decorator.func, ast.Attribute)
            and decorator.func.attr in rules.ROUTE_DECORATORS
            for decorator in function.decorator_list
        )

    # -- shared -------------------------------------------------------------

    def _function(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        parent = self._parent(node)
        while parent is not None and not isinstance(parent, _FUNCTIONS):
            if isinstance(parent, ast.ClassDef | ast.Lambda):
                return None
            parent = self._parent(parent)
        return parent

    def _import(
        self, name: str, module: str, sources: frozenset[str]
    ) -> tuple[tuple[str, str], ...] | str:
        """The import ``name`` needs (none when the file binds it from an
        equivalent module), or why it cannot be used here."""
        origin = self._bindings.get(name)
        if origin is None:
            return ((module, name),)
        source, _, attribute = origin.rpartition(".")
        if attribute == name and source in sources:
            return ()
        return f"{name} is already bound in this file ({origin})"


@dataclass(frozen=True, slots=True)
class HTTPSite:
    """What a ``raise HTTPException(...)`` becomes, before its way is known."""

    action: RaiseSemantic
    status_node: ast.expr
    code: int


def http_exception_site(node: ast.AST, raised: ast.AST | None) -> HTTPSite | str:
    """The rewrite of the HTTPException call ``node`` (``raised``: its
    parent), or why it has none: read from the call alone."""
    if not isinstance(node, ast.Call):
        return "HTTPException is raised without a status"
    if not (isinstance(raised, ast.Raise) and raised.exc is node):
        return "HTTPException(...) is built, not raised, here"
    arguments = [*node.args, *node.keywords]
    if any(isinstance(a, ast.Starred) for a in node.args) or any(
        k.arg is None for k in node.keywords
    ):
        return "its arguments are unpacked (* or **)"
    if len(node.args) > 2:
        return "it has arguments besides status and detail"
    extra = [k.arg for k in node.keywords if k.arg not in ("status_code", "detail")]
    if extra:
        return f"{extra[0]}= has no equivalent on a semantic exception"
    roles: dict[str, int] = {}
    for index, argument in enumerate(arguments):
        role = (
            ("status_code", "detail")[index]
            if isinstance(argument, ast.expr)
            else argument.arg
        )
        roles[role or ""] = index
    if "status_code" not in roles:
        return "HTTPException has no status"
    status_node = _value(arguments[roles["status_code"]])
    status = _status(status_node)
    if status is None:
        return "its status is not a literal"
    chosen = rules.semantic_type_for_status(status)
    if chosen is None:
        return f"{status} is not an error status"
    type_name, explicit = chosen
    detail = roles.get("detail")
    if detail is not None and isinstance(_value(arguments[detail]), _STRUCTURED):
        return "its detail is structured data, not a message"
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    return HTTPSite(
        RaiseSemantic(
            type_name,
            roles["status_code"],
            detail,
            phrase,
            status if explicit else None,
        ),
        status_node,
        status,
    )


def handler_at(tree: ast.Module, line: int, column: int) -> ast.ExceptHandler | None:
    """The except clause at ``ast``'s (line, column)."""
    for chain in chains_at(tree, line):
        for node, _ in chain:
            for handler in getattr(node, "handlers", ()):
                if (handler.lineno, handler.col_offset) == (line, column):
                    return handler
    return None


def widen_position(
    handler: ast.ExceptHandler, bindings: dict[str, str]
) -> int | str | None:
    """Where ``VLLMError`` goes in ``handler``'s caught types: after the
    tuple element that is HTTPException (its index), or None (a single
    name becomes a tuple); why it cannot, as text."""
    caught = handler.type
    if isinstance(caught, ast.Name | ast.Attribute):
        return None
    if not isinstance(caught, ast.Tuple) or not all(
        isinstance(e, ast.Name | ast.Attribute) for e in caught.elts
    ):
        return "its caught types are not names"
    for index, element in enumerate(caught.elts):
        name = _last(_dotted(element))
        if _last(bindings.get(name, name)) == "HTTPException":
            return index
    return len(caught.elts) - 1


Chain = list[tuple[ast.AST, str]]
_BLOCKS = ("body", "orelse", "finalbody")


def chains_at(tree: ast.Module, line: int) -> list[Chain]:
    """Every statement whose lines hold ``line``, each as the way down to
    it: (node, the field of it the next step is in), ending with (the
    statement, ""). Compound statements come before what they hold."""
    found: list[Chain] = []
    stack: list[tuple[Sequence[ast.stmt], Chain]] = [(tree.body, [(tree, "body")])]
    while stack:
        body, chain = stack.pop()
        for stmt in body:
            if (stmt.end_lineno or stmt.lineno) < line or (
                stmt.lineno > line and _start(stmt)[0] > line
            ):
                continue
            found.append([*chain, (stmt, "")])
            for name in _BLOCKS:
                block = getattr(stmt, name, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    stack.append((block, [*chain, (stmt, name)]))
            for part in (*getattr(stmt, "handlers", ()), *getattr(stmt, "cases", ())):
                holder = "handlers" if isinstance(part, ast.ExceptHandler) else "cases"
                stack.append((part.body, [*chain, (stmt, holder), (part, "body")]))
    return found


def package_root(path: Path) -> Path:
    """The outermost folder with an ``__init__.py`` above ``path`` (its own
    folder when that has none)."""
    folder = Path(os.path.abspath(path)).parent
    while (folder.parent / "__init__.py").is_file():
        folder = folder.parent
    return folder


def _python_files(root: Path) -> Iterator[Path]:
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [
            d for d in subfolders if not d.startswith(".") and d != "__pycache__"
        ]
        yield from (Path(folder, name) for name in names if name.endswith(".py"))


class ModelIndex:
    """Request models' fields, read (never imported) from the audited tree:
    a class's annotated fields and its bases', following imports to the
    module that defines it."""

    def __init__(self) -> None:
        self._trees: dict[Path, ast.Module | None] = {}

    def fields(
        self, path: Path, tree: ast.Module, name: str, depth: int = 0
    ) -> frozenset[str] | None:
        if depth > _MODEL_DEPTH:
            return None
        for stmt in tree.body:
            if isinstance(stmt, ast.ClassDef) and stmt.name == name:
                found = set(_fields(stmt))
                for base in stmt.bases:
                    inherited = self.fields(path, tree, _last(_dotted(base)), depth + 1)
                    found |= inherited or set()
                return frozenset(found)
        for stmt in _statements(tree.body):
            if not isinstance(stmt, ast.ImportFrom):
                continue
            for alias in stmt.names:
                if (alias.asname or alias.name) != name:
                    continue
                target = _module_file(path, stmt.module or "", stmt.level)
                other = None if target is None else self._parse(target)
                if target is None or other is None:
                    return None
                return self.fields(target, other, alias.name, depth + 1)
        return None

    def _parse(self, path: Path) -> ast.Module | None:
        if path not in self._trees:
            try:
                self._trees[path] = ast.parse(read_regular(path))
            except (_Unreadable, SyntaxError, ValueError, RecursionError, MemoryError):
                self._trees[path] = None
        return self._trees[path]


# -- helpers without state ----------------------------------------------------


def module_bindings(tree: ast.Module) -> dict[str, str]:
    """Names bound at module level (also inside its ``if``/``try`` blocks):
    imports as ``module.name``, everything else as ``<local>.name``."""
    bound: dict[str, str] = {}
    for stmt in _statements(tree.body):
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                head = alias.name.partition(".")[0]
                bound[alias.asname or head] = alias.name if alias.asname else head
        elif isinstance(stmt, ast.ImportFrom):
            module = "." * stmt.level + (stmt.module or "")
            for alias in stmt.names:
                if alias.name != "*":
                    bound[alias.asname or alias.name] = f"{module}.{alias.name}"
        else:
            for name in _stored_names(stmt):
                bound[name] = f"<local>.{name}"
    return bound


def _statements(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of ``body`` and of its blocks, not of nested scopes."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, _SCOPES):
            continue
        for name in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(stmt, name, []))
        for part in (*getattr(stmt, "handlers", ()), *getattr(stmt, "cases", ())):
            yield from _statements(part.body)


def _stored_names(stmt: ast.stmt) -> Iterator[str]:
    """Names ``stmt`` itself binds (not its blocks)."""
    if isinstance(stmt, _SCOPES) and not isinstance(stmt, ast.Lambda):
        yield stmt.name
        return
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        targets = [stmt.target]
    elif isinstance(stmt, ast.For | ast.AsyncFor):
        targets = [stmt.target]
    elif isinstance(stmt, ast.With | ast.AsyncWith):
        targets = [i.optional_vars for i in stmt.items if i.optional_vars is not None]
    elif isinstance(stmt, ast.Import | ast.ImportFrom):
        for alias in stmt.names:
            yield alias.asname or alias.name.partition(".")[0]
        return
    for target in targets:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name):
                yield sub.id


def _walk(body: Sequence[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of ``body``, not entering nested scopes."""
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(
            child
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, _SCOPES)
        )


def _path(root: ast.AST, target: ast.AST) -> list[ast.AST] | None:
    """The nodes from ``root`` (excluded) down to ``target``, descending only
    into nodes whose span (decorators included) holds ``target``'s; in a
    block, only into the statement starting last before it. Iterative: a
    left-nested expression thousands deep must not exhaust the stack."""
    parents: dict[ast.AST, ast.AST] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        for child in _candidates(node, target):
            parents[child] = node
            if child is target:
                chain = [child]
                while parents[chain[-1]] is not root:
                    chain.append(parents[chain[-1]])
                return chain[::-1]
            if _holds(child, target):
                stack.append(child)
    return None


def _candidates(node: ast.AST, target: ast.AST) -> Iterator[ast.AST]:
    for _, value in ast.iter_fields(node):
        children = value if isinstance(value, list) else [value]
        if children and isinstance(children[0], ast.stmt):
            starts = [_start(stmt) for stmt in children]
            index = bisect_right(starts, (target.lineno, target.col_offset)) - 1
            children = children[index : index + 1] if index >= 0 else []
        yield from (
            child
            for child in children
            if isinstance(child, ast.AST) and not isinstance(child, _TOKENS)
        )


def _start(node: ast.AST) -> tuple[int, int]:
    """Where ``node``'s text starts: its first decorator, if it has one."""
    return min(
        [
            (node.lineno, node.col_offset),
            *((d.lineno, d.col_offset) for d in getattr(node, "decorator_list", ())),
        ]
    )


def _holds(node: ast.AST, target: ast.AST) -> bool:
    if not hasattr(node, "end_lineno") or not hasattr(target, "lineno"):
        return True  # no position (arguments, comprehensions): look inside
    return _start(node) <= (target.lineno, target.col_offset) and (
        target.end_lineno,
        target.end_col_offset,
    ) <= (node.end_lineno, node.end_col_offset)


def _message_argument(call: ast.Call) -> ast.expr | None:
    """The first argument (or ``message=``) of a call."""
    for keyword in call.keywords:
        if keyword.arg == "message":
            return keyword.value
    return call.args[0] if call.args else None


def _value(argument: ast.expr | ast.keyword) -> ast.expr:
    return argument.value if isinstance(argument, ast.keyword) else argument


def _names(*nodes: ast.AST | None) -> tuple[str, ...]:
    """The distinct names read in ``nodes``, in order."""
    seen: dict[str, None] = {}
    for node in nodes:
        if node is None:
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                seen.setdefault(sub.id, None)
    return tuple(seen)


def _elements(caught: ast.expr | None) -> list[ast.expr]:
    if isinstance(caught, ast.Tuple):
        return list(caught.elts)
    return [] if caught is None else [caught]


def _mentions(annotation: ast.expr | None, name: str) -> bool:
    return annotation is not None and name in _annotation_names(annotation)


def _annotation_names(annotation: ast.expr) -> list[str]:
    """Class names an annotation mentions (string annotations parsed)."""
    names: list[str] = []
    for sub in ast.walk(annotation):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            try:
                names += _annotation_names(ast.parse(sub.value, mode="eval").body)
            except SyntaxError:
                continue
        elif isinstance(sub, ast.Name):
            names.append(sub.id)
        elif isinstance(sub, ast.Attribute):
            names.append(sub.attr)
    return names


def _request_models(annotation: ast.expr | None) -> list[str]:
    """``...Request`` classes an annotation names, but not the framework's
    raw ``Request`` (the HTTP request itself)."""
    if annotation is None:
        return []
    return [
        name
        for name in _annotation_names(annotation)
        if name.endswith("Request") and name != "Request"
    ]


def _fields(cls: ast.ClassDef) -> list[str]:
    return [
        stmt.target.id
        for stmt in cls.body
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
    ]


def _module_file(here: Path, module: str, level: int) -> Path | None:
    """The file of ``module`` as imported from ``here``: relative to its
    package, or looked for below each folder above it."""
    parts = [p for p in module.split(".") if p]
    if level:
        bases = [here.parents[level - 1]] if level <= len(here.parents) else []
    else:
        bases = list(here.parents)
    for base in bases:
        target = base.joinpath(*parts)
        for candidate in (target.with_suffix(".py"), target / "__init__.py"):
            if parts and candidate.is_file():
                return candidate
    return None


def _named_field(message: ast.expr, boundary: _Boundary) -> str | None:
    """The first field of the request model the message names: read from
    the request (``{request.voice}``), or written in the text as the first
    word, quoted, or with an underscore (``top_k``), so plain words
    ("model", "input") in a sentence do not count."""
    fields = boundary.fields
    if isinstance(message, ast.Constant) and isinstance(message.value, str):
        parts: list[ast.expr] = [message]
    elif isinstance(message, ast.JoinedStr):
        parts = list(message.values)
    else:
        return None
    first = True
    for part in parts:
        if isinstance(part, ast.FormattedValue):
            field_name = _request_attribute(part.value, boundary.name)
            if field_name is not None and (fields is None or field_name in fields):
                return field_name
            first = False
            continue
        if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
            continue
        text = part.value
        for match in _WORD.finditer(text):
            word = match.group()
            quoted = text[match.start() - 1 : match.start()] in tuple(_QUOTES) and text[
                match.end() : match.end() + 1
            ] in tuple(_QUOTES)
            if (
                fields is not None
                and word in fields
                and (first or quoted or "_" in word)
            ):
                return word
            first = False
    return None


def _request_attribute(node: ast.expr, request: str | None) -> str | None:
    """``x`` of ``request.x`` (or ``request.x.y``), else None."""
    chain: list[str] = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    if request is not None and isinstance(node, ast.Name) and node.id == request:
        return chain[-1] if chain else None
    return None


def _status_operands(node: ast.expr) -> Iterator[ast.Attribute]:
    """The outermost ``<x>.status_code`` reads in ``node``."""
    stack: list[ast.AST] = [node]
    while stack:
        sub = stack.pop()
        if isinstance(sub, ast.Attribute) and sub.attr == "status_code":
            yield sub
            continue
        stack.extend(ast.iter_child_nodes(sub))


_COMPARE = {
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_ARITHMETIC = {
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
}


def _evaluate(node: ast.expr, operand: str, status: int) -> object:
    """``node`` with the status ``operand`` (an ``ast.dump``) set to
    ``status``; only literals, comparisons, ``and``/``or``/``not``, integer
    arithmetic, ``range`` and the range helpers."""
    if ast.dump(node) == operand:
        return status
    literal = _status(node)
    if literal is not None and not isinstance(node, ast.Call):
        return literal
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, operand, status)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            compare = _COMPARE.get(type(op))
            if compare is None:
                raise _NotStatic
            right = _evaluate(comparator, operand, status)
            try:
                holds = compare(left, right)
            except TypeError as exc:
                raise _NotStatic from exc
            if not holds:
                return False
            left = right
        return True
    if isinstance(node, ast.BoolOp):
        values = [bool(_evaluate(v, operand, status)) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _evaluate(node.operand, operand, status)
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left = _evaluate(node.left, operand, status)
        right = _evaluate(node.right, operand, status)
        if not (isinstance(left, int) and isinstance(right, int)) or (
            isinstance(node.op, ast.FloorDiv | ast.Mod) and right == 0
        ):
            raise _NotStatic
        return _ARITHMETIC[type(node.op)](left, right)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return tuple(_evaluate(e, operand, status) for e in node.elts)
    if isinstance(node, ast.Call) and not node.keywords:
        name = _last(_dotted(node.func))
        values = [_evaluate(a, operand, status) for a in node.args]
        if name == "range" and all(isinstance(v, int) for v in values) and values:
            return range(*values)  # type: ignore[arg-type]
        if name == "int" and len(values) == 1 and isinstance(values[0], int):
            return values[0]
        if name in rules.STATUS_RANGE_CALLS and len(values) == 1:
            (value,) = values
            if not isinstance(value, int):
                raise _NotStatic
            low = 400 if name == "is_client_error_status" else 500
            return low <= value < low + 100
        if literal is not None:
            return literal
    raise _NotStatic
