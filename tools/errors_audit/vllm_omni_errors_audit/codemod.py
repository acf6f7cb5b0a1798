"""Performing a plan with LibCST: text edits that rewrite only what changes.

Owns turning each ``rewrite.Rewrite`` into an edit of the file's text, and
the import edits they need. Every rewritten expression (and every import
statement touched) is parsed by LibCST, changed on its concrete syntax tree
and re-emitted from it, so its formatting and comments survive; nothing else
in the file is re-emitted at all, so every other line stays byte for byte
what it was. (A whole-file LibCST parse is not needed for that, and it costs
0.3-0.6 s per large file of the 0.30 tree before any rewrite starts.)

An except clause ``flow`` found letting HTTPException through and not the
new types is widened in the same edit set: ``VLLMError`` is added beside
``HTTPException`` (``except (HTTPException, VLLMError)``), and the names
it catches count as read, so its imports stay.

Imports: the names a file's rewrites need are added once per file, merged
into its first top-level ``from <module> import ...`` of the same module or
else on a new line after its last top-level import; an import whose name
the rewrites made unused (``HTTPException``, ``HTTPStatus``, ``status``) is
removed. A rewrite that would drop a comment (on an argument it removes) is
refused with ``RewriteError``, never performed.

This module imports LibCST; the command line imports it only for ``--fix``
and ``--suggest``, so a plain audit never pays for it.
"""

from __future__ import annotations

import ast
import json
import re
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TypeVar

import libcst as cst

from vllm_omni_errors_audit import rules
from vllm_omni_errors_audit.rewrite import (
    AddStatus,
    FilePlan,
    NarrowExcept,
    RaiseModel,
    RaiseSemantic,
    RenameRaise,
    Rewrite,
    UseCategory,
    Widen,
    WrapModel,
)
from vllm_omni_errors_audit.runner import Replacement

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_NO_SPACE = cst.SimpleWhitespace("")
_EQUAL = cst.AssignEqual(whitespace_before=_NO_SPACE, whitespace_after=_NO_SPACE)
_CLIENT_BASE = "VLLMClientError"
# What a line the rewrites write from scratch may hold (ruff's and black's
# default).
_LINE_LENGTH = 88
_Item = TypeVar("_Item", cst.Arg, cst.Element, cst.ImportAlias)


class RewriteError(Exception):
    """A rewrite that cannot be performed as planned; nothing is written."""


@dataclass(frozen=True, slots=True, order=True)
class Edit:
    """Replace ``text[start:end]`` (character offsets) with ``new``."""

    start: int
    end: int
    new: str


class Text:
    """A file's text with its line starts (the tokenizer's line breaks)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0, *(m.end() for m in _LINE_BREAK.finditer(text))]
        found = _LINE_BREAK.search(text)
        self.newline = found.group() if found else "\n"

    def offset(self, line: int, column: int) -> int:
        """The offset of ``ast``'s (1-based line, UTF-8 byte column)."""
        start = self.starts[line - 1]
        end = self.starts[line] if line < len(self.starts) else len(self.text)
        row = self.text[start:end]
        if row.isascii():
            return start + column
        prefix = row.encode("utf-8", "surrogatepass")[:column]
        return start + len(prefix.decode("utf-8", "surrogatepass"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        assert node.end_lineno is not None and node.end_col_offset is not None
        return (
            self.offset(node.lineno, node.col_offset),
            self.offset(node.end_lineno, node.end_col_offset),
        )

    def line_start(self, line: int) -> int:
        return self.starts[line - 1] if line <= len(self.starts) else len(self.text)

    def position(self, offset: int) -> tuple[int, int]:
        """1-based line and UTF-16 column (SARIF's) of ``offset``."""
        line = bisect_right(self.starts, offset)
        prefix = self.text[self.starts[line - 1] : offset]
        return line, len(prefix.encode("utf-16-le", "surrogatepass")) // 2 + 1


def edits(
    plan: FilePlan,
    rewrites: Sequence[Rewrite],
    *,
    unbind: bool,
    widen: Sequence[Widen] = (),
) -> list[Edit]:
    """The edits of ``rewrites``, of the except clauses ``widen`` names and
    of the imports they need; with ``unbind``, also the removal of imports
    nothing uses any more."""
    text = Text(plan.text)
    changes = [_edit(text, rewrite) for rewrite in rewrites]
    changes += [_widen(text, clause) for clause in widen]
    unused: set[str] = set()
    if unbind:
        candidates = {name for rewrite in rewrites for name in rewrite.unbinds}
        # A widened clause still reads what it caught.
        candidates -= {
            node.id
            for clause in widen
            for node in ast.walk(clause.handler.type or ast.Module())
            if isinstance(node, ast.Name)
        }
        unused = {
            name for name in candidates if not _read(text, plan.tree, name, changes)
        }
    needs = [*(r.imports for r in rewrites), *(w.imports for w in widen)]
    changes += _import_edits(text, plan.tree, needs, unused)
    changes.sort()
    for before, after in pairwise(changes):
        if after.start < before.end:
            raise RewriteError("two rewrites overlap")
    return changes


def apply(text: str, changes: Iterable[Edit]) -> str:
    """``text`` with ``changes`` (which do not overlap) made."""
    out: list[str] = []
    position = 0
    for change in sorted(changes):
        out += [text[position : change.start], change.new]
        position = change.end
    out.append(text[position:])
    return "".join(out)


def moved(text: str, changes: Iterable[Edit], offset: int) -> int:
    """Where ``offset`` of ``text`` is once ``changes`` are made (no change
    spans it)."""
    return offset + sum(
        len(change.new) - (change.end - change.start)
        for change in changes
        if change.end <= offset
    )


def replacements(plan: FilePlan, changes: Sequence[Edit]) -> tuple[Replacement, ...]:
    """``changes`` as SARIF regions of the original file."""
    text = Text(plan.text)
    out = []
    for change in changes:
        start_line, start_column = text.position(change.start)
        end_line, end_column = text.position(change.end)
        out.append(
            Replacement(start_line, start_column, end_line, end_column, change.new)
        )
    return tuple(out)


# -- one rewrite ----------------------------------------------------------------


def _edit(text: Text, rewrite: Rewrite) -> Edit:
    action, node = rewrite.action, rewrite.node
    if isinstance(action, RaiseModel):
        return _raise_model_edit(text, node, action)
    if isinstance(action, NarrowExcept):
        assert isinstance(node, ast.ExceptHandler)
        if node.type is None:
            # ``except:`` -> ``except VLLMClientError:``
            keyword = text.offset(node.lineno, node.col_offset) + len("except")
            return Edit(keyword, keyword, f" {_CLIENT_BASE}")
        target: ast.AST = node.type
    elif isinstance(action, WrapModel):
        assert isinstance(node, ast.Return) and node.value is not None
        target = node.value
    elif isinstance(action, RenameRaise):
        assert isinstance(node, ast.Raise) and node.exc is not None
        target = node.exc
    else:
        target = node
    start, end = _exact_span(text, target)
    source = text.text[start:end]
    module, expression = _parse_expression(source)
    new = _rewrite(module, expression, action, text)
    code = module.code_for_node(new)
    if isinstance(new, cst.Call) and isinstance(action, WrapModel):
        # A call this rewrite writes from scratch is laid out the way a
        # formatter would: one argument per line when the line is too long.
        line = bisect_right(text.starts, start)
        before = text.text[text.starts[line - 1] : start]
        after = text.text[end:].split("\n", 1)[0]
        if len(before) + len(code) + len(after) > _LINE_LENGTH:
            indent = before[: len(before) - len(before.lstrip())]
            code = module.code_for_node(_one_per_line(new, indent))
    return Edit(start, end, code)


def _raise_model_edit(text: Text, node: ast.AST, action: RaiseModel) -> Edit:
    """``return create_error_response(msg, ...)`` -> ``raise <Type>(msg)``:
    the statement's keyword and the call change, the message argument keeps
    its text and layout; the type and status arguments go (``_drop``: a
    comment at the end of a dropped line moves to the line before, any other
    refuses the rewrite)."""
    assert isinstance(node, ast.Return) and isinstance(node.value, ast.Call)
    start, _ = text.span(node)
    value_start, end = _exact_span(text, node.value)
    if text.text[start:value_start].rstrip() != "return":
        raise RewriteError("the returned call is not where the statement says")
    module, call = _parse_expression(text.text[value_start:end])
    if not isinstance(call, cst.Call):
        raise RewriteError("the returned expression is not a call")
    args = list(call.args)
    keep = next(
        (
            index
            for index, arg in enumerate(args)
            if arg.keyword is not None and arg.keyword.value == "message"
        ),
        0,
    )
    lead = call.whitespace_before_args
    # Last first: the indices not visited yet still name the same arguments.
    for index in reversed(range(len(args))):
        if index != keep:
            args, lead = _drop(args, index, lead)
    args[0] = args[0].with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)
    new = call.with_changes(
        func=cst.Name(action.type_name), args=args, whitespace_before_args=lead
    )
    if action.explicit is not None:
        new = _append(new, _keyword("status_code", cst.Integer(str(action.explicit))))
    return Edit(start, end, "raise " + module.code_for_node(new))


def _widen(text: Text, widen: Widen) -> Edit:
    """``except X`` -> ``except (X, VLLMError)``; in a tuple, ``VLLMError``
    right after HTTPException, separated like its neighbours."""
    caught = widen.handler.type
    assert caught is not None
    start, end = _exact_span(text, caught)
    _, expression = _parse_expression(text.text[start:end])
    base = cst.Element(cst.Name(rules.FIX_BASE))
    if widen.after is None:
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        new: cst.BaseExpression = cst.Tuple(
            elements=[cst.Element(expression, comma=comma), base]
        )
    else:
        if not isinstance(expression, cst.Tuple):
            raise RewriteError("the caught types are not a tuple")
        parenthesis = expression.lpar[0] if expression.lpar else None
        lead: cst.CSTNode = (
            parenthesis.whitespace_after if parenthesis else cst.SimpleWhitespace("")
        )
        elements = list(expression.elements)
        if widen.after + 1 < len(elements):
            elements = _insert_item(elements, widen.after + 1, base, lead)
        else:
            # Last: it takes the last one's comma (a closing line break of
            # a tuple belongs to its parenthesis), and the separator before
            # the last one goes between them.
            last = elements[-1]
            separator = _without_comment(_preceding(elements, len(elements) - 1, lead))
            elements[-1] = last.with_changes(
                comma=cst.Comma(whitespace_after=separator)
            )
            elements.append(base.with_changes(comma=last.comma))
        new = expression.with_changes(elements=elements)
    return Edit(start, end, cst.Module(body=[]).code_for_node(new))


def _exact_span(text: Text, node: ast.AST) -> tuple[int, int]:
    """``node``'s source span, which must hold exactly the node (positions
    inside f-strings, for one, are not always right): else nothing is
    rewritten."""
    start, end = text.span(node)
    try:
        spanned = ast.parse(f"({text.text[start:end]})", mode="eval").body
    except SyntaxError:
        spanned = None
    if spanned is None or ast.dump(spanned) != ast.dump(node):
        raise RewriteError("the node's source span does not hold the node")
    return start, end


def _one_per_line(call: cst.Call, indent: str) -> cst.Call:
    inner = _line_break(indent + "    ")
    last = len(call.args) - 1
    args = [
        arg.with_changes(
            comma=cst.Comma(
                whitespace_after=inner if i < last else _line_break(indent)
            ),
            whitespace_after_arg=_NO_SPACE,
        )
        for i, arg in enumerate(call.args)
    ]
    return call.with_changes(whitespace_before_args=inner, args=args)


def _line_break(indent: str) -> cst.ParenthesizedWhitespace:
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(),
        empty_lines=[],
        indent=False,
        last_line=cst.SimpleWhitespace(indent),
    )


def _import_code(printer: cst.Module, node: cst.ImportFrom) -> str:
    """A top-level ``from`` import; in parentheses, one name per line, when
    one line would be too long."""
    code = printer.code_for_node(node)
    if node.lpar is not None or len(code) <= _LINE_LENGTH:
        return code
    names = list(node.names)
    return printer.code_for_node(
        node.with_changes(
            lpar=cst.LeftParen(whitespace_after=_line_break("    ")),
            names=[
                alias.with_changes(
                    comma=cst.Comma(
                        whitespace_after=_line_break(
                            "    " if i < len(names) - 1 else ""
                        )
                    )
                )
                for i, alias in enumerate(names)
            ],
            rpar=cst.RightParen(),
        )
    )


def _rewrite(
    module: cst.Module,
    expression: cst.BaseExpression,
    action: object,
    text: Text,
) -> cst.CSTNode:
    if isinstance(action, RaiseSemantic | RenameRaise | AddStatus):
        if not isinstance(expression, cst.Call):
            raise RewriteError("the rewritten expression is not a call")
        if isinstance(action, RaiseSemantic):
            return _raise_semantic(expression, action)
        if isinstance(action, RenameRaise):
            call = expression.with_changes(func=cst.Name(action.type_name))
            if action.parameter is None:
                return call
            return _append(call, _keyword("parameter", _string(action.parameter)))
        return _append(
            expression, _keyword("status_code", cst.Integer(str(action.status)))
        )
    if isinstance(action, WrapModel):
        content = cst.Call(
            func=cst.Name("jsonable_encoder"), args=[cst.Arg(value=expression)]
        )
        return cst.Call(
            func=cst.Name("JSONResponse"),
            args=[
                _keyword("content", content),
                _keyword("status_code", cst.Integer(str(action.status))),
            ],
        )
    if isinstance(action, UseCategory):
        start, end = text.span(action.record)
        _, record = _parse_expression(text.text[start:end])
        comparison = cst.Comparison(
            left=cst.Attribute(value=record, attr=cst.Name("category")),
            comparisons=[
                cst.ComparisonTarget(
                    operator=cst.Equal(), comparator=_string(action.category)
                )
            ],
        )
        if action.parenthesize:
            return comparison.with_changes(
                lpar=[cst.LeftParen()], rpar=[cst.RightParen()]
            )
        return comparison
    assert isinstance(action, NarrowExcept)
    return _narrow(module, expression, action)


def _raise_semantic(call: cst.Call, action: RaiseSemantic) -> cst.Call:
    args = list(call.args)
    if action.detail is None:
        # No detail: Starlette sends the status's phrase; so does the type.
        args[action.status] = args[action.status].with_changes(
            keyword=None,
            equal=cst.MaybeSentinel.DEFAULT,
            value=_string(action.message),
        )
    else:
        args[action.detail] = args[action.detail].with_changes(
            keyword=None, equal=cst.MaybeSentinel.DEFAULT
        )
        args, lead = _drop(args, action.status, call.whitespace_before_args)
        call = call.with_changes(whitespace_before_args=lead)
    call = call.with_changes(func=cst.Name(action.type_name), args=args)
    if action.explicit is not None:
        # OmniClientError / OmniServerError keep the status the client saw.
        return _append(call, _keyword("status_code", cst.Integer(str(action.explicit))))
    return call


def _narrow(
    module: cst.Module, caught: cst.BaseExpression, action: NarrowExcept
) -> cst.BaseExpression:
    client = cst.Name(_CLIENT_BASE)
    if not action.broad:
        return client
    if not isinstance(caught, cst.Tuple):
        raise RewriteError("the caught types are not a tuple")
    elements = list(caught.elements)
    first, *others = action.broad
    elements[first] = elements[first].with_changes(value=client)
    parenthesis = caught.lpar[0] if caught.lpar else None
    lead: cst.CSTNode = (
        parenthesis.whitespace_after if parenthesis else cst.SimpleWhitespace("")
    )
    for index in sorted(others, reverse=True):
        elements, lead = _drop(elements, index, lead)
    if len(elements) == 1:
        # One type left: the tuple's parentheses go with it.
        return client
    if parenthesis is not None:
        caught = caught.with_changes(
            lpar=[parenthesis.with_changes(whitespace_after=lead), *caught.lpar[1:]]
        )
    return caught.with_changes(elements=elements)


# -- argument lists -------------------------------------------------------------


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(keyword=cst.Name(name), value=value, equal=_EQUAL)


def _string(value: str) -> cst.SimpleString:
    return cst.SimpleString(json.dumps(value))


def _drop(
    items: list[_Item], index: int, lead: cst.CSTNode
) -> tuple[list[_Item], cst.CSTNode]:
    """``items`` without ``items[index]``, the separators kept as they were,
    and ``lead`` (the whitespace after the opening parenthesis). A comment
    at the end of the line that goes moves to the end of the line before;
    where it cannot, the drop is refused (a comment is never lost)."""
    items = list(items)
    dropped = items[index]
    if _has_comment([dropped.with_changes(comma=cst.MaybeSentinel.DEFAULT)]):
        raise RewriteError("a comment sits inside what the rewrite removes")
    if index == len(items) - 1 and index > 0:
        # The last one goes: the one before takes its comma (or none) and
        # its closing whitespace, and keeps a comment its own comma had.
        before = items[index - 1]
        comment = _line_comment(_comma_of(before))
        moved: dict[str, object] = {"comma": dropped.comma}
        if isinstance(dropped, cst.Arg):
            moved["whitespace_after_arg"] = dropped.whitespace_after_arg
        if comment is not None:
            comma = dropped.comma
            closing = (
                comma.whitespace_after
                if isinstance(comma, cst.Comma)
                else moved.get("whitespace_after_arg")
            )
            if not _takes_comment(closing):
                raise RewriteError("a comment sits on a line the rewrite removes")
            assert isinstance(closing, cst.ParenthesizedWhitespace)
            closing = closing.with_changes(first_line=comment)
            if isinstance(comma, cst.Comma):
                moved["comma"] = comma.with_changes(whitespace_after=closing)
            else:
                moved["whitespace_after_arg"] = closing
        items[index - 1] = before.with_changes(**moved)
        return items[:index], lead
    comment = _line_comment(_comma_of(dropped))
    if comment is not None:
        preceding = _preceding(items, index, lead)
        if not _takes_comment(preceding):
            raise RewriteError("a comment sits on a line the rewrite removes")
        assert isinstance(preceding, cst.ParenthesizedWhitespace)
        preceding = preceding.with_changes(first_line=comment)
        if index == 0:
            lead = preceding
        else:
            comma = items[index - 1].comma
            assert isinstance(comma, cst.Comma)
            items[index - 1] = items[index - 1].with_changes(
                comma=comma.with_changes(whitespace_after=preceding)
            )
    return items[:index] + items[index + 1 :], lead


def _line_comment(comma: cst.CSTNode) -> cst.TrailingWhitespace | None:
    """The end-of-line comment a separator carries (None if it has none);
    refused when it carries another comment (on lines of their own)."""
    after = getattr(comma, "whitespace_after", None)
    if isinstance(after, cst.ParenthesizedWhitespace):
        if _has_comment(after.empty_lines) or _has_comment(
            [comma.with_changes(whitespace_after=cst.SimpleWhitespace(""))]
        ):
            raise RewriteError("a comment sits on a line the rewrite removes")
        if after.first_line.comment is not None:
            return after.first_line
        return None
    if _has_comment([comma]):
        raise RewriteError("a comment sits on what the rewrite removes")
    return None


def _takes_comment(whitespace: object) -> bool:
    return (
        isinstance(whitespace, cst.ParenthesizedWhitespace)
        and whitespace.first_line.comment is None
    )


def _comma_of(item: cst.CSTNode) -> cst.CSTNode:
    comma = getattr(item, "comma", cst.MaybeSentinel.DEFAULT)
    return comma if isinstance(comma, cst.Comma) else cst.Comma()


def _has_comment(nodes: Iterable[cst.CSTNode]) -> bool:
    found: list[cst.Comment] = []

    class _Comments(cst.CSTVisitor):
        def visit_Comment(self, node: cst.Comment) -> None:
            found.append(node)

    for node in nodes:
        node.visit(_Comments())
    return bool(found)


def _append(call: cst.Call, new: cst.Arg) -> cst.Call:
    """``call`` with ``new`` as its last argument, laid out like the others."""
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new])
    return call.with_changes(args=_append_item(args, new, call.whitespace_before_args))


def _append_item(items: list[_Item], new: _Item, lead: cst.CSTNode) -> list[_Item]:
    """``items`` with ``new`` last. Written one per line (the whitespace
    before the last item breaks the line), the new item gets its own line
    and the trailing comma or closing line break moves to it; a comment
    stays on the line it was on. Else it follows ``, ``."""
    last = items[-1]
    before = _preceding(items, len(items) - 1, lead)
    trailing = last.comma
    closing: cst.CSTNode = (
        trailing.whitespace_after
        if isinstance(trailing, cst.Comma)
        else getattr(last, "whitespace_after_arg", _NO_SPACE)
    )
    if isinstance(closing, cst.ParenthesizedWhitespace) and isinstance(
        before, cst.ParenthesizedWhitespace
    ):
        separator = before.with_changes(first_line=closing.first_line)
        end = closing.with_changes(first_line=cst.TrailingWhitespace())
    else:
        separator, end = cst.SimpleWhitespace(" "), closing
    comma = trailing if isinstance(trailing, cst.Comma) else cst.Comma()
    moved: dict[str, object] = {"comma": comma.with_changes(whitespace_after=separator)}
    if isinstance(last, cst.Arg):
        moved["whitespace_after_arg"] = _NO_SPACE
    if isinstance(trailing, cst.Comma):
        tail = new.with_changes(comma=trailing.with_changes(whitespace_after=end))
    elif isinstance(new, cst.Arg):
        tail = new.with_changes(whitespace_after_arg=end)
    else:
        tail = new
    return [*items[:-1], last.with_changes(**moved), tail]


def _preceding(items: Sequence[_Item], index: int, lead: cst.CSTNode) -> cst.CSTNode:
    """The whitespace before ``items[index]``: the previous comma's, or
    ``lead`` (after the opening parenthesis) for the first."""
    if index == 0:
        return lead
    comma = items[index - 1].comma
    return comma.whitespace_after if isinstance(comma, cst.Comma) else lead


def _parse_expression(source: str) -> tuple[cst.Module, cst.BaseExpression]:
    """``source`` (an expression's exact span) parsed; the parentheses put
    around it (so a span across lines parses) are taken off again."""
    try:
        module = cst.parse_module(f"({source})")
    except (cst.ParserSyntaxError, RecursionError) as exc:
        raise RewriteError(f"LibCST cannot parse the expression: {exc}") from exc
    statement = module.body[0]
    assert isinstance(statement, cst.SimpleStatementLine)
    expression = statement.body[0]
    assert isinstance(expression, cst.Expr)
    value = expression.value
    return module, value.with_changes(lpar=value.lpar[1:], rpar=value.rpar[:-1])


# -- imports ----------------------------------------------------------------------


def _import_edits(
    text: Text,
    tree: ast.Module,
    needs: Sequence[tuple[tuple[str, str], ...]],
    unused: set[str],
) -> list[Edit]:
    needed: dict[str, set[str]] = {}
    for imports in needs:
        for module, name in imports:
            needed.setdefault(module, set()).add(name)
    # Per import statement: the names to drop and to add.
    drops: dict[ast.stmt, set[str]] = {}
    for stmt in _every_statement(tree.body):
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            names = {_bound(stmt, alias) for alias in stmt.names} & unused
            if names:
                drops[stmt] = names
    adds: dict[ast.stmt, list[str]] = {}
    new_lines: dict[str, list[str]] = {}
    for module, names in sorted(needed.items()):
        host = next(
            (
                stmt
                for stmt in tree.body
                if isinstance(stmt, ast.ImportFrom)
                and stmt.level == 0
                and stmt.module == module
                and all(alias.name != "*" for alias in stmt.names)
                and not drops.get(stmt)
            ),
            None,
        )
        if host is None:
            new_lines[module] = sorted(names)
        else:
            adds[host] = sorted(names)
    changes = [
        change
        for stmt in {*drops, *adds}
        for change in [
            _import_edit(text, tree, stmt, drops.get(stmt, set()), adds.get(stmt, []))
        ]
        if change is not None
    ]
    if new_lines:
        changes.append(_new_imports(text, tree, new_lines))
    return changes


def _every_statement(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement, in functions and classes too (imports are
    statements: no expression needs walking)."""
    for stmt in body:
        yield stmt
        for block in _blocks(stmt):
            yield from _every_statement(block)


def _bound(stmt: ast.Import | ast.ImportFrom, alias: ast.alias) -> str:
    if alias.asname:
        return alias.asname
    return alias.name.partition(".")[0] if isinstance(stmt, ast.Import) else alias.name


def _import_edit(
    text: Text, tree: ast.Module, stmt: ast.stmt, drop: set[str], add: list[str]
) -> Edit | None:
    """Re-emit one import statement with names dropped and added; when
    nothing is left, delete its lines (or keep it where that is unsafe)."""
    assert isinstance(stmt, ast.Import | ast.ImportFrom)
    start, end = text.span(stmt)
    try:
        module = cst.parse_module(text.text[start:end])
    except cst.ParserSyntaxError as exc:
        raise RewriteError(f"LibCST cannot parse an import: {exc}") from exc
    line = module.body[0]
    assert isinstance(line, cst.SimpleStatementLine)
    node = line.body[0]
    assert isinstance(node, cst.Import | cst.ImportFrom)
    names = list(node.names) if not isinstance(node.names, cst.ImportStar) else []
    kept = names
    lead: cst.CSTNode = (
        node.lpar.whitespace_after
        if isinstance(node, cst.ImportFrom) and node.lpar is not None
        else cst.SimpleWhitespace(" ")
    )
    for index in reversed(range(len(names))):
        alias = names[index]
        bound = alias.evaluated_alias or (
            alias.evaluated_name.partition(".")[0]
            if isinstance(node, cst.Import)
            else alias.evaluated_name
        )
        if bound in drop:
            if len(kept) == 1:
                kept = []
                break
            try:
                kept, lead = _drop(kept, index, lead)
            except RewriteError:
                return None  # keep the import rather than lose a comment
    if not kept and not add:
        return _delete_statement(text, tree, stmt)
    for name in add:
        kept = _insert_alias(kept, cst.ImportAlias(name=cst.Name(name)), lead)
    if isinstance(node, cst.Import) or node.lpar is None:
        # Without parentheses an import cannot end in a comma.
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        changed = node.with_changes(names=kept)
        if isinstance(changed, cst.ImportFrom) and add:
            return Edit(start, end, _import_code(module, changed))
        return Edit(start, end, module.code_for_node(changed))
    parenthesis = node.lpar.with_changes(whitespace_after=lead)
    return Edit(
        start,
        end,
        module.code_for_node(node.with_changes(names=kept, lpar=parenthesis)),
    )


def _insert_alias(
    names: list[cst.ImportAlias], new: cst.ImportAlias, lead: cst.CSTNode
) -> list[cst.ImportAlias]:
    """``names`` with ``new`` in sorted position when they are sorted (else
    last), separated like its neighbours."""
    values = [alias.evaluated_name for alias in names]
    position = len(names)
    if values == sorted(values):
        position = next(
            (i for i, value in enumerate(values) if value > new.evaluated_name),
            len(names),
        )
    return _insert_item(names, position, new, lead)


def _insert_item(
    items: list[_Item], position: int, new: _Item, lead: cst.CSTNode
) -> list[_Item]:
    """``items`` with ``new`` at ``position``, separated like its
    neighbours."""
    if position == len(items):
        return _append_item(items, new, lead)
    # ``new`` takes ``items[position]``'s place; what preceded that one now
    # separates the two.
    separator = _without_comment(_preceding(items, position, lead))
    comma = cst.Comma(whitespace_after=separator)
    return [*items[:position], new.with_changes(comma=comma), *items[position:]]


def _without_comment(whitespace: cst.CSTNode) -> cst.CSTNode:
    if isinstance(whitespace, cst.ParenthesizedWhitespace):
        return whitespace.with_changes(
            first_line=cst.TrailingWhitespace(), empty_lines=[]
        )
    return whitespace


def _delete_statement(text: Text, tree: ast.Module, stmt: ast.stmt) -> Edit | None:
    """Delete ``stmt``'s whole lines, if it has them to itself and its block
    keeps a statement; else None (the import stays)."""
    assert stmt.end_lineno is not None
    start, end = text.span(stmt)
    first = text.line_start(stmt.lineno)
    after = text.line_start(stmt.end_lineno + 1)
    rest = text.text[end:after].strip()
    if text.text[first:start].strip() or (rest and not rest.startswith("#")):
        return None
    block = next(
        (
            body
            for parent in _every_statement(tree.body)
            for body in _blocks(parent)
            if any(s is stmt for s in body)
        ),
        tree.body if any(s is stmt for s in tree.body) else None,
    )
    if block is not tree.body and (block is None or len(block) < 2):
        return None
    # The only statement between two blank lines (an import group of its
    # own): one of the blank lines goes too.
    previous = text.text[text.line_start(stmt.lineno - 1) : first]
    following = text.text[after : text.line_start(stmt.end_lineno + 2)]
    if stmt.lineno > 1 and not previous.strip() and following and not following.strip():
        after += len(following)
    return Edit(first, after, "")


def _new_imports(text: Text, tree: ast.Module, lines: dict[str, list[str]]) -> Edit:
    """One ``from <module> import ...`` line per module, after the file's
    last top-level import before its first definition (or after its
    docstring and ``__future__`` imports)."""
    body = tree.body
    first_definition = next(
        (
            index
            for index, stmt in enumerate(body)
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ),
        len(body),
    )
    imports = [
        stmt
        for stmt in body[:first_definition]
        if isinstance(stmt, ast.Import | ast.ImportFrom)
    ]
    anchor: ast.stmt | None = imports[-1] if imports else None
    if anchor is None and body and _is_docstring(body[0]):
        anchor = body[0]
    printer = cst.Module(body=[], default_newline=text.newline)
    code = "".join(
        _import_code(
            printer,
            cst.ImportFrom(
                module=_dotted(module),
                names=[cst.ImportAlias(name=cst.Name(n)) for n in names],
            ),
        )
        + text.newline
        for module, names in lines.items()
    )
    if anchor is None:
        offset = text.line_start(body[0].lineno) if body else len(text.text)
        return Edit(offset, offset, code)
    assert anchor.end_lineno is not None
    offset = text.line_start(anchor.end_lineno + 1)
    if offset == len(text.text) and not text.text.endswith(("\n", "\r")):
        code = text.newline + code
    return Edit(offset, offset, code)


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _dotted(module: str) -> cst.Attribute | cst.Name:
    head, *rest = module.split(".")
    node: cst.Attribute | cst.Name = cst.Name(head)
    for part in rest:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def _read(text: Text, tree: ast.Module, name: str, changes: Sequence[Edit]) -> bool:
    """Whether ``name`` is still read once ``changes`` are made: a load of
    it outside the rewritten spans, in a string annotation, or in a
    module-level ``__all__``. Only the statements on the lines where the
    word occurs are looked at."""
    spans = [(change.start, change.end) for change in changes]
    pattern = re.compile(rf"(?<![\w.]){re.escape(name)}\b")
    for match in pattern.finditer(text.text):
        if any(start <= match.start() < end for start, end in spans):
            continue
        line = bisect_right(text.starts, match.start())
        stmt = _statement_at(tree.body, line)
        if stmt is None:
            continue
        if any(stmt is top for top in tree.body) and _is_all(stmt):
            return True
        for node in _header(stmt):
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Name)
                    and sub.id == name
                    and not isinstance(sub.ctx, ast.Store)
                    and sub.lineno == line
                ):
                    start = text.offset(sub.lineno, sub.col_offset)
                    if not any(s <= start < e for s, e in spans):
                        return True
        if any(_annotation_reads(a, name) for a in _annotations(stmt)):
            return True
    return False


def _statement_at(body: Sequence[ast.stmt], line: int) -> ast.stmt | None:
    """The innermost statement of ``body`` whose lines hold ``line``."""
    for stmt in body:
        first = min([stmt.lineno, *(d.lineno for d in _decorators(stmt))])
        if not first <= line <= (stmt.end_lineno or stmt.lineno):
            continue
        for block in _blocks(stmt):
            inner = _statement_at(block, line)
            if inner is not None:
                return inner
        return stmt
    return None


def _blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    blocks = [getattr(stmt, name, None) for name in ("body", "orelse", "finalbody")]
    blocks += [part.body for part in getattr(stmt, "handlers", [])]
    blocks += [part.body for part in getattr(stmt, "cases", [])]
    return [block for block in blocks if isinstance(block, list)]


def _header(stmt: ast.stmt) -> list[ast.AST]:
    """What ``stmt`` holds besides its blocks: its expressions, decorators,
    arguments, the types its handlers catch, its cases' patterns."""
    nodes: list[object] = []
    for name, value in ast.iter_fields(stmt):
        if name not in ("body", "orelse", "finalbody", "handlers", "cases"):
            nodes += value if isinstance(value, list) else [value]
    for handler in getattr(stmt, "handlers", []):
        nodes.append(handler.type)
    for case in getattr(stmt, "cases", []):
        nodes += [case.pattern, case.guard]
    return [node for node in nodes if isinstance(node, ast.AST)]


def _annotations(stmt: ast.stmt) -> list[ast.expr | None]:
    if isinstance(stmt, ast.AnnAssign):
        return [stmt.annotation]
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
        arguments = stmt.args
        every = [
            *arguments.posonlyargs,
            *arguments.args,
            *arguments.kwonlyargs,
            arguments.vararg,
            arguments.kwarg,
        ]
        return [stmt.returns, *(a.annotation for a in every if a is not None)]
    return []


def _decorators(stmt: ast.stmt) -> list[ast.expr]:
    return getattr(stmt, "decorator_list", [])


def _annotation_reads(annotation: ast.expr | None, name: str) -> bool:
    """A string annotation (``-> "Name"``, ``x: "Name"``) naming ``name``."""
    if not (isinstance(annotation, ast.Constant) and isinstance(annotation.value, str)):
        return False
    try:
        parsed = ast.parse(annotation.value, mode="eval")
    except SyntaxError:
        return False
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(parsed))


def _is_all(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, ast.AugAssign | ast.AnnAssign):
        targets = [stmt.target]
    else:
        return False
    return any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)
