"""Where an HTTPException raised at a site goes, and whether the type
``--fix`` raises there instead goes the same way.

Owns the proof behind OMNI005's rewrite. ``HTTPException(N, msg)`` and the
type ``--fix`` raises for N render alike (the framework handler turns the
one into the record the other makes), so what can differ is only the way
to the response. This module follows it: up the ``try`` statements of the
raise's function, then, unless that function is a route (the framework
catches what a route raises), to every place in its package that calls
the function, and on from each, until the exception is answered. At each
``try`` the first except clause that catches either type decides:

- one that catches both alike and does not look at what it caught
  (``except Exception: raise HTTPException(500, ...)``) answers both the
  same way: this way is proven;
- one that re-raises (``except Exception: cleanup(); raise``) sends it on;
- one that catches HTTPException and not the new type is *widened*:
  ``VLLMError``, the base of every type ``--fix`` raises, joins
  HTTPException in it, so the new type takes the same clause. 0.30's
  image and video routes wrap their bodies in ``except HTTPException:
  raise`` before ``except Exception: ... 500``; without this a 400 raised
  inside would become a 500.

A site is left, with the reason, when its way meets a clause that catches
the new type and not HTTPException; a clause that looks at the exception
(hands it to a call, reads an attribute: what ``create_error_response(
exc)`` or 0.30's ``_video_error_from_exception(exc)`` make of it depends
on its type; logging it, formatting it into a message or re-raising it
does not count); a clause to widen in a file outside the paths given or
whose caught types are not plain names; a ``with suppress(...)`` that
swallows one type only; or a call it cannot follow: the function
referenced without being called (a callback, a task) or imported under
another name, a coroutine not awaited where it is called, a generator not
iterated there, a name called from more places than are followed.

Callers are found by name (``f(...)``, ``x.f(...)``): every reference to a
function or method of that name anywhere in the package counts (``self.f``
only from a related class, a bare ``f`` only where it is the module's own
or imported), which can only add ways to prove. The package is the
outermost folder with an ``__init__.py`` (the errors package left out: it
renders both alike); what calls in from outside it is not seen: a function
nothing in the package calls (a pydantic validator, a callback a framework
registers) is taken as answered by the framework, as a route is, and
decorators around a route are not followed. The names are looked for in
every file of the package at once, one pass per step away from the raise
sites (the C lexer's needle pass where it is built), and only the files
that name one are parsed.

Stdlib only (``ast``).
"""

from __future__ import annotations

import ast
import builtins
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from vllm_omni_errors_audit import rules
from vllm_omni_errors_audit.rewrite import (
    Chain,
    Clause,
    Way,
    _python_files,
    chains_at,
    http_exception_site,
    module_bindings,
    package_root,
    widen_position,
)
from vllm_omni_errors_audit.runner import (
    ReportedFinding,
    _gc_paused,
    _owned,
    _printable,
    _Unreadable,
    read_regular,
)
from vllm_omni_errors_audit.scanner import _dotted, _last
from vllm_omni_errors_audit.skeleton import _lexer

_OLD = "HTTPException"
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_SCOPES = (*_FUNCTIONS, ast.ClassDef, ast.Lambda)
_BLOCK_FIELDS = frozenset({"body", "orelse", "finalbody", "handlers", "cases"})
# A name referenced in more places than this is not followed: a common
# method name would make each of them one more way to prove.
_MAX_REFERENCES = 64
# The C lexer's needle pass takes at most this many needles.
_NEEDLES_PER_PASS = 256
# ``Depends(f)``: the framework calls ``f`` and renders what it raises as
# it renders a route's.
_FRAMEWORK_CALLS = frozenset({"Depends", "Security"})
_LOG_METHODS = frozenset(
    {"debug", "info", "warning", "warn", "error", "exception", "critical", "log"}
)
_TEXT_CALLS = frozenset({"str", "repr"})
# Awaiting ``wait_for(coro)`` or ``shield(coro)`` raises what ``coro``
# raises, where it is awaited.
_AWAIT_THROUGH = frozenset({"wait_for", "shield"})
# Calls that iterate a generator handed to them on the spot.
_CONSUMERS = frozenset(
    {
        "list",
        "tuple",
        "set",
        "frozenset",
        "sorted",
        "dict",
        "sum",
        "any",
        "all",
        "min",
        "max",
        "next",
    }
)
_Key = tuple[Path, int, int, str]
# How many classes up a lineage is read.
_MAX_LINEAGE = 8


@dataclass(frozen=True, slots=True)
class _Target:
    """A function being left: its name and kind, and what a reference must
    be to call it (a method is called through an attribute)."""

    function: ast.FunctionDef | ast.AsyncFunctionDef
    path: Path
    # The class it is a method of, and the module that defines it.
    owner: ast.ClassDef | None
    module: _Module

    @property
    def name(self) -> str:
        return self.function.name


def trace(
    sites: Sequence[tuple[ReportedFinding, Path]], audited: Iterable[Path]
) -> dict[str, Way]:
    """By fingerprint, the way of each OMNI005 site (its finding and file)
    whose call ``--fix`` can rewrite; ``audited``: the files ``--fix`` may
    change (a clause to widen elsewhere blocks the site)."""
    # Absolute, not resolved: resolving costs system calls per path part,
    # and a tree reached through a link then only has fewer clauses widened.
    allowed = frozenset(absolute(path) for path in audited)
    by_package: dict[Path, list[tuple[ReportedFinding, Path]]] = defaultdict(list)
    for finding, path in sites:
        by_package[package_root(path)].append((finding, absolute(path)))
    ways: dict[str, Way] = {}
    with _gc_paused():
        for root, group in sorted(by_package.items()):
            ways.update(_Package(root, allowed).trace(group))
    return ways


@dataclass(frozen=True, slots=True)
class _Result:
    """A way, possibly not followed to its end yet (``pending``: a name's
    callers are not looked up; ``cuts``: it returned to a function still
    being followed, so it is not final for the functions below that one)."""

    blocked: str | None = None
    widen: frozenset[Clause] = frozenset()
    pending: bool = False
    cuts: frozenset[_Key] = frozenset()

    def plus(self, widen: Iterable[Clause]) -> _Result:
        if self.blocked is not None:
            return self
        return _Result(None, self.widen | frozenset(widen), self.pending, self.cuts)


def _join(parts: Iterable[_Result]) -> _Result:
    """Every way must hold: the first blocked one in order decides, once
    none before it is pending."""
    widen: set[Clause] = set()
    cuts: set[_Key] = set()
    pending = False
    for part in parts:
        if part.blocked is not None and not pending:
            return _Result(part.blocked)
        pending |= part.pending or part.blocked is not None
        widen |= part.widen
        cuts |= part.cuts
    return _Result(None, frozenset(widen), pending, frozenset(cuts))


@dataclass(frozen=True, slots=True)
class _Answer:
    """What a ``try`` does with the exception: blocked, sent on (with the
    clause to widen for that), or answered."""

    blocked: str | None = None
    widen: frozenset[Clause] = frozenset()
    answered: bool = False


class _Pending(Exception):
    """A name whose references are not looked up yet."""


@dataclass(frozen=True, slots=True)
class _Module:
    path: Path
    shown: str
    tree: ast.Module
    bindings: dict[str, str]
    # The file imports FastAPI or Starlette: its decorated routes are routes.
    web: bool
    # Module-level ``NAME = (A, B)``: what ``except NAME`` catches.
    tuples: dict[str, tuple[str, ...]]


class _Package:
    """One package: its files' bytes and trees, the references found so
    far, and the ways followed."""

    def __init__(self, root: Path, audited: frozenset[Path]) -> None:
        self._root = root
        self._audited = audited
        self._data: dict[Path, bytes] | None = None
        self._modules: dict[Path, _Module | None] = {}
        self._references: dict[str, list[tuple[Path, int]]] = {}
        self._missing: set[str] = set()
        self._memo: dict[_Key, _Result] = {}
        self._active: set[_Key] = set()
        self._lineages: dict[tuple[Path, str], frozenset[str] | None] = {}

    def trace(self, sites: list[tuple[ReportedFinding, Path]]) -> dict[str, Way]:
        """Follow every site, looking names up in rounds: each round
        follows every open site as far as the references found allow, then
        looks up every name it was missing in one pass over the package."""
        ways: dict[str, Way] = {}
        open_sites = sites
        while open_sites:
            # Final ways stay valid: only the pending ones are followed again.
            self._missing.clear()
            still: list[tuple[ReportedFinding, Path]] = []
            for finding, path in open_sites:
                result = self._site(finding, path)
                if result is None:
                    continue
                if result.pending:
                    still.append((finding, path))
                else:
                    ways[finding.fingerprint] = Way(result.blocked, result.widen)
            if still:
                self._look_up(self._missing)
            open_sites = still
        return ways

    # -- one site -----------------------------------------------------------

    def _site(self, finding: ReportedFinding, path: Path) -> _Result | None:
        """The way of one site; None when its call cannot be rewritten at
        all (the plan says why)."""
        module = self._module(path)
        if module is None:
            return None
        for chain in chains_at(module.tree, finding.line):
            stmt = chain[-1][0]
            if not (isinstance(stmt, ast.Raise) and isinstance(stmt.exc, ast.Call)):
                continue
            call = stmt.exc
            if finding.line not in (stmt.lineno, call.lineno):
                continue
            site = http_exception_site(call, stmt)
            if isinstance(site, str):
                return None
            return self._up(module, chain, site.action.type_name)
        return None

    def _up(self, module: _Module, chain: Chain, new: str) -> _Result:
        """The way of an exception that leaves the last statement of
        ``chain``: through the ``try`` statements around it, then out of
        its function."""
        widen: set[Clause] = set()
        for index in range(len(chain) - 2, -1, -1):
            node, held_in = chain[index]
            if isinstance(node, _FUNCTIONS):
                owner = chain[index - 1][0] if index else None
                target = _Target(
                    node,
                    module.path,
                    owner if isinstance(owner, ast.ClassDef) else None,
                    module,
                )
                return self._leave(target, node, new).plus(widen)
            if isinstance(node, ast.Try | ast.TryStar) and held_in == "body":
                answer = self._try(module, chain[: index + 1], node, new)
                if answer.blocked is not None:
                    return _Result(answer.blocked)
                widen |= answer.widen
                if answer.answered:
                    return _Result(widen=frozenset(widen))
            if isinstance(node, ast.With | ast.AsyncWith) and held_in == "body":
                swallowed = self._suppressed(module, chain[: index + 1], node, new)
                if swallowed is not None:
                    return swallowed
        # Raised while a module or a class body runs: at import, where no
        # request is answered.
        return _Result(widen=frozenset(widen))

    def _try(
        self, module: _Module, chain: Chain, node: ast.Try | ast.TryStar, new: str
    ) -> _Answer:
        old, fresh = rules.ancestors(_OLD), rules.ancestors(new)
        for handler in node.handlers:
            clause = self._clause(module, chain, handler)
            caught = self._caught(module, handler)
            if isinstance(caught, str):
                return _Answer(f"its way meets {clause}, {caught}")
            catches_old = caught is None or bool(caught & old)
            catches_new = caught is None or bool(caught & fresh)
            if not (catches_old or catches_new):
                continue
            if not catches_old:
                return _Answer(
                    f"its way meets {clause}, which catches {new} and not {_OLD}"
                )
            widen: frozenset[Clause] = frozenset()
            if not catches_new:
                reason = self._widenable(module, handler)
                if reason is not None:
                    return _Answer(
                        f"its way meets {clause}, which lets {_OLD} through and "
                        f"not {new}; --fix would widen it, but {reason}"
                    )
                widen = frozenset(
                    {Clause(module.path, handler.lineno, handler.col_offset, clause)}
                )
            looks = _looks_at(handler)
            if looks is not None:
                return _Answer(
                    f"its way meets {clause}, which {looks}: what becomes of "
                    "the exception there depends on its type"
                )
            return _Answer(widen=widen, answered=not _reraises(handler))
        return _Answer()

    def _suppressed(
        self, module: _Module, chain: Chain, node: ast.With | ast.AsyncWith, new: str
    ) -> _Result | None:
        """``with suppress(...)`` around the exception: it swallows both
        alike (answered), one only (blocked), or neither (None)."""
        old, fresh = rules.ancestors(_OLD), rules.ancestors(new)
        for item in node.items:
            call = item.context_expr
            if not (
                isinstance(call, ast.Call) and _last(_dotted(call.func)) == "suppress"
            ):
                continue
            handler = ast.ExceptHandler(type=ast.Tuple(elts=list(call.args)))
            caught = self._caught(module, handler)
            where = f"{self._clause(module, chain, handler)} (suppress)"
            if isinstance(caught, str):
                return _Result(f"its way meets {where}, {caught}")
            assert caught is not None
            if bool(caught & old) != bool(caught & fresh):
                return _Result(
                    f"its way meets {where}, which swallows one of {_OLD} and "
                    f"{new} and not the other"
                )
            if caught & old:
                return _Result()
        return None

    def _widenable(self, module: _Module, handler: ast.ExceptHandler) -> str | None:
        if module.path not in self._audited:
            return "its file is not among the paths given"
        position = widen_position(handler, module.bindings)
        if isinstance(position, str):
            return position
        origin = module.bindings.get(rules.FIX_BASE)
        if origin is not None and not (
            origin.rpartition(".")[2] == rules.FIX_BASE
            and origin.rpartition(".")[0] in rules.SEMANTIC_SOURCES
        ):
            return f"its file binds {rules.FIX_BASE} to {origin}"
        return None

    def _caught(
        self, module: _Module, handler: ast.ExceptHandler
    ) -> frozenset[str] | str | None:
        """The class names ``handler`` catches (imports resolved to their
        own names); None for a bare except; why they are unknown, as text."""
        if handler.type is None:
            return None
        elements = (
            handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        )
        names: set[str] = set()
        for element in elements:
            if not isinstance(element, ast.Name | ast.Attribute):
                return "whose caught types are not names"
            name = _last(_dotted(element))
            if isinstance(element, ast.Name) and name in module.tuples:
                names.update(module.tuples[name])
                continue
            name = _last(module.bindings.get(name, name))
            # A class is named in CapWords; anything else (``errors``,
            # ``RETRYABLE``) is a value that may hold any class.
            if not name[:1].isupper() or name.isupper():
                return f"whose caught type {name} is a value, not a class"
            names.add(name)
        return frozenset(names)

    def _clause(self, module: _Module, chain: Chain, handler: ast.ExceptHandler) -> str:
        """``path (scope: except A, B)``: named by its function, not its
        line (lines move when the file is rewritten in the same run)."""
        scope = ".".join(
            node.name
            for node, _ in chain
            if isinstance(node, (*_FUNCTIONS, ast.ClassDef))
        )
        if handler.type is None:
            caught = "except:"
        else:
            elements = (
                handler.type.elts
                if isinstance(handler.type, ast.Tuple)
                else [handler.type]
            )
            shown = sorted(
                {
                    _last(module.bindings.get(_last(_dotted(e)), _last(_dotted(e))))
                    for e in elements
                }
            )
            caught = "except " + ", ".join(shown)
        if handler.name:
            caught += f" as {handler.name}"
        return f"{module.shown} ({scope or '<module>'}: {caught})"

    # -- out of a function --------------------------------------------------

    def _leave(
        self,
        target: _Target,
        function: ast.FunctionDef | ast.AsyncFunctionDef,
        new: str,
    ) -> _Result:
        if target.module.web and _is_route(function):
            return _Result()
        key = (target.path, function.lineno, function.col_offset, new)
        if key in self._memo:
            return self._memo[key]
        if key in self._active:
            return _Result(cuts=frozenset({key}))
        self._active.add(key)
        try:
            result = self._callers(target, new)
        finally:
            self._active.discard(key)
        result = _Result(
            result.blocked, result.widen, result.pending, result.cuts - {key}
        )
        if not result.pending and not result.cuts:
            self._memo[key] = result
        return result

    def _callers(self, target: _Target, new: str) -> _Result:
        name = target.name
        try:
            places = self._places(name)
        except _Pending:
            return _Result(pending=True)
        if len(places) > _MAX_REFERENCES:
            return _Result(
                f"{name} is named in {len(places)} places of its package, more "
                f"than the {_MAX_REFERENCES} followed"
            )
        kind = _kind(target.function)
        parts: list[_Result] = []
        for path, line in places:
            caller = self._module(path)
            if caller is None:
                parts.append(_Result(f"{_shown(path)} names {name} and does not parse"))
                continue
            for chain in chains_at(caller.tree, line):
                stmt = chain[-1][0]
                if isinstance(stmt, ast.Import | ast.ImportFrom) and any(
                    alias.name.rpartition(".")[2] == name and alias.asname
                    for alias in stmt.names
                ):
                    parts.append(
                        _Result(
                            f"{caller.shown}:{line} imports {name} under another "
                            "name: calls by that name are not followed"
                        )
                    )
                for node, parents in _references(stmt, name, line):
                    if self._may_call(caller, chain, node, target):
                        parts.append(
                            self._reference(
                                caller, chain, node, parents, target.name, kind, new
                            )
                        )
        return _join(parts)

    def _reference(
        self,
        caller: _Module,
        chain: Chain,
        node: ast.expr,
        parents: list[ast.AST],
        name: str,
        kind: str,
        new: str,
    ) -> _Result:
        where = f"{caller.shown}:{node.lineno}"
        parent = parents[-1] if parents else None
        if isinstance(parent, ast.Call) and node in parent.args:
            if _last(_dotted(parent.func)) in _FRAMEWORK_CALLS:
                return _Result()
        if not (isinstance(parent, ast.Call) and parent.func is node):
            return _Result(
                f"{where} refers to {name} without calling it (a callback, a "
                "task): where its exception goes from there is not followed"
            )
        if any(isinstance(p, ast.Lambda | ast.GeneratorExp) for p in parents):
            return _Result(
                f"{where} calls {name} in a lambda or generator expression, "
                "which runs later, elsewhere"
            )
        outer = parents[-2] if len(parents) > 1 else None
        stmt = chain[-1][0]
        if (
            kind == "coroutine"
            and not isinstance(outer, ast.Await)
            and not _awaited_through(parent, parents)
        ):
            return _Result(
                f"{where} calls {name} without awaiting it: the coroutine runs "
                "elsewhere"
            )
        if kind == "generator" and not (
            (isinstance(stmt, ast.For | ast.AsyncFor) and stmt.iter is parent)
            or (isinstance(outer, ast.comprehension) and outer.iter is parent)
            or isinstance(outer, ast.YieldFrom)
            or (
                isinstance(outer, ast.Call)
                and outer.args == [parent]
                and _dotted(outer.func) in _CONSUMERS
            )
        ):
            return _Result(
                f"{where} calls the generator {name} without iterating it "
                "there: it raises where it is iterated"
            )
        return self._up(caller, chain, new)

    def _may_call(
        self, caller: _Module, chain: Chain, node: ast.expr, target: _Target
    ) -> bool:
        """Whether the reference ``node`` may call ``target``: a bare name
        calls a module's function (its own, or one it imports), ``self.f``
        and ``super().f`` a method of a class related to the caller's;
        anything else (``handler.f``) may call any method of that name."""
        if isinstance(node, ast.Name):
            if target.owner is not None:
                return False
            if caller.path == target.path:
                return True
            origin = caller.bindings.get(node.id)
            if origin is not None:
                return not origin.startswith("<local>.")
            # Imported inside a function (or ``*``), or a name of its own
            # there.
            imported = _imported(caller.tree)
            return node.id in imported or "*" in imported
        assert isinstance(node, ast.Attribute)
        receiver = node.value
        own = (isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")) or (
            isinstance(receiver, ast.Call) and _dotted(receiver.func) == "super"
        )
        if not own:
            return True
        if target.owner is None:
            return False
        cls = next((n for n, _ in reversed(chain) if isinstance(n, ast.ClassDef)), None)
        if cls is None:
            return True
        mine = self._lineage(caller, cls.name, 0)
        theirs = self._lineage(target.module, target.owner.name, 0)
        return (
            mine is None
            or theirs is None
            or target.owner.name in mine
            or cls.name in theirs
        )

    def _lineage(self, module: _Module, name: str, depth: int) -> frozenset[str] | None:
        """``name`` and its ancestors in the package (by name), from the
        class of that name ``module`` defines or imports; None when they
        cannot all be read (a class outside the package has none inside
        it)."""
        key = (module.path, name)
        if key not in self._lineages:
            self._lineages[key] = self._read_lineage(module, name, depth)
        return self._lineages[key]

    def _read_lineage(
        self, module: _Module, name: str, depth: int
    ) -> frozenset[str] | None:
        if depth > _MAX_LINEAGE:
            return None
        for stmt in module.tree.body:
            if isinstance(stmt, ast.ClassDef) and stmt.name == name:
                found = {name}
                for base in stmt.bases:
                    inherited = self._lineage(module, _last(_dotted(base)), depth + 1)
                    if inherited is None:
                        return None
                    found |= inherited
                return frozenset(found)
        origin = module.bindings.get(name)
        if origin is None or origin.startswith("<local>."):
            # A builtin base (``object``, ``Exception``) is outside too.
            return frozenset() if hasattr(builtins, name) else None
        source, _, attribute = origin.rpartition(".")
        if not (source.startswith(".") or source.partition(".")[0] == self._root.name):
            return frozenset()  # outside the package
        path = _module_file(module.path, source, self._root)
        other = None if path is None else self._module(path)
        return None if other is None else self._lineage(other, attribute, depth + 1)

    # -- the package's files ------------------------------------------------

    def _places(self, name: str) -> list[tuple[Path, int]]:
        """Where ``name`` occurs in the package's files (path, line)."""
        found = self._references.get(name)
        if found is None:
            self._missing.add(name)
            raise _Pending
        return found

    def _look_up(self, names: Iterable[str]) -> None:
        """One pass over every file of the package for ``names``."""
        wanted = sorted(set(names) - set(self._references))
        data = self._files()
        for start in range(0, len(wanted), _NEEDLES_PER_PASS):
            chunk = wanted[start : start + _NEEDLES_PER_PASS]
            for name in chunk:
                self._references[name] = []
            for path, text in data.items():
                for name, lines in _needle_lines(text, chunk).items():
                    self._references[name] += [(path, line) for line in lines]

    def _files(self) -> dict[Path, bytes]:
        if self._data is None:
            self._data = {}
            for path in sorted(_python_files(self._root)):
                if _owned(str(path)):
                    continue
                try:
                    self._data[path] = read_regular(path)
                except _Unreadable:
                    continue
        return self._data

    def _module(self, path: Path) -> _Module | None:
        if path not in self._modules:
            self._modules[path] = _parse(path, (self._data or {}).get(path))
        return self._modules[path]


def _parse(path: Path, data: bytes | None) -> _Module | None:
    try:
        if data is None:
            data = read_regular(path)
        tree = ast.parse(data)
    except (_Unreadable, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    bindings = module_bindings(tree)
    tuples = {
        target.id: tuple(_last(_dotted(e)) for e in stmt.value.elts)
        for stmt in tree.body
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Tuple)
        for target in stmt.targets
        if isinstance(target, ast.Name)
        and all(isinstance(e, ast.Name | ast.Attribute) for e in stmt.value.elts)
    }
    web = any(
        origin.partition(".")[0] in rules.WEB_FRAMEWORKS for origin in bindings.values()
    )
    return _Module(path, _shown(path), tree, bindings, web, tuples)


@cache
def _imported(tree: ast.Module) -> frozenset[str]:
    """Every name an import anywhere in ``tree`` binds (``*`` for a star)."""
    return frozenset(
        alias.asname or alias.name.partition(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    )


def absolute(path: Path) -> Path:
    """``path`` made absolute without touching the file system."""
    return Path(os.path.abspath(path))


def _shown(path: Path) -> str:
    shown = os.path.relpath(path)
    return _printable(str(path) if shown.startswith(os.pardir) else shown)


def _needle_lines(data: bytes, names: Sequence[str]) -> dict[str, list[int]]:
    """The lines of ``data`` each of ``names`` that occurs is on."""
    if _lexer is not None:
        # Most files name none: one group says which, then one per name.
        _, present = _lexer.needle_lines(data, (tuple(names),))
        if not present:
            return {}
        hits = sorted(present)
        lines, _ = _lexer.needle_lines(data, tuple((name,) for name in hits))
        return dict(zip(hits, lines, strict=True))
    found: dict[str, list[int]] = {}
    pattern = re.compile(b"|".join(re.escape(name.encode()) for name in names))
    line, position = 1, 0
    for match in pattern.finditer(data):
        line += data.count(b"\n", position, match.start())
        position = match.start()
        rows = found.setdefault(match.group().decode(), [])
        if not rows or rows[-1] != line:
            rows.append(line)
    return found


def _module_file(here: Path, source: str, root: Path) -> Path | None:
    """The file of module ``source`` (``pkg.a.b`` or ``..a``) imported in
    ``here``, inside the package ``root``."""
    level = len(source) - len(source.lstrip("."))
    parts = [p for p in source.lstrip(".").split(".") if p]
    if level:
        base = here.parents[level - 1] if level <= len(here.parents) else None
    else:
        base, parts = root, parts[1:]
    if base is None:
        return None
    target = base.joinpath(*parts)
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _awaited_through(call: ast.Call, parents: list[ast.AST]) -> bool:
    """``await asyncio.wait_for(call, ...)``: the awaited wrapper raises
    what the coroutine raises."""
    if len(parents) < 3:
        return False
    wrapper, awaited = parents[-2], parents[-3]
    return (
        isinstance(wrapper, ast.Call)
        and wrapper.args[:1] == [call]
        and _last(_dotted(wrapper.func)) in _AWAIT_THROUGH
        and isinstance(awaited, ast.Await)
    )


def _is_route(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(
        isinstance(decorator, ast.Call)
        and isinstance(decorator.func, ast.Attribute)
        and decorator.func.attr in rules.ROUTE_DECORATORS
        for decorator in function.decorator_list
    )


@cache
def _kind(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """``generator`` (sync or async), ``coroutine`` or ``function``."""
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Yield | ast.YieldFrom):
            return "generator"
        stack.extend(
            child
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, _SCOPES)
        )
    return "coroutine" if isinstance(function, ast.AsyncFunctionDef) else "function"


def _references(
    stmt: ast.AST, name: str, line: int
) -> Iterator[tuple[ast.expr, list[ast.AST]]]:
    """Loads of ``name`` (``name``, ``x.name``) on ``line`` in ``stmt``'s
    own expressions (not in the statements it holds), with the nodes above
    each within the statement."""
    roots: list[ast.AST] = []
    for field, value in ast.iter_fields(stmt):
        if field in _BLOCK_FIELDS:
            continue
        roots += [v for v in (value if isinstance(value, list) else [value])]
    stack: list[tuple[ast.AST, list[ast.AST]]] = [
        (root, []) for root in roots if isinstance(root, ast.AST)
    ]
    while stack:
        node, above = stack.pop()
        if (
            isinstance(node, ast.Name)
            and node.id == name
            and node.lineno == line
            and isinstance(node.ctx, ast.Load)
        ) or (
            isinstance(node, ast.Attribute)
            and node.attr == name
            and node.end_lineno == line
            and isinstance(node.ctx, ast.Load)
        ):
            yield node, above
        below = [*above, node]
        stack.extend((child, below) for child in ast.iter_child_nodes(node))


def _looks_at(handler: ast.ExceptHandler) -> str | None:
    """How ``handler`` uses the exception it binds in a way that may depend
    on its type, as text; None when it only re-raises, logs or formats it."""
    bound = handler.name
    if bound is None:
        return None
    stack: list[tuple[ast.AST, list[ast.AST]]] = [(s, []) for s in handler.body]
    while stack:
        node, above = stack.pop()
        below = [*above, node]
        stack.extend((child, below) for child in ast.iter_child_nodes(node))
        if not (
            isinstance(node, ast.Name)
            and node.id == bound
            and isinstance(node.ctx, ast.Load)
        ):
            continue
        use = _use(node, above)
        if use is not None:
            return use
    return None


def _use(node: ast.Name, above: list[ast.AST]) -> str | None:
    parent = above[-1] if above else None
    if isinstance(parent, ast.Raise | ast.FormattedValue):
        return None
    if isinstance(parent, ast.keyword):
        parent = above[-2] if len(above) > 1 else None
        if isinstance(parent, ast.Call) and _logs(parent.func):
            return None
    if isinstance(parent, ast.Call) and parent.func is not node:
        callee = _dotted(parent.func) or "a call"
        if callee in _TEXT_CALLS or _logs(parent.func):
            return None
        return f"hands {node.id} to {callee}()"
    if isinstance(parent, ast.Tuple) and len(above) > 1:
        parent = above[-2]
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mod):
        return None
    if isinstance(parent, ast.Attribute):
        return f"reads {node.id}.{parent.attr}"
    return f"uses {node.id}"


def _logs(func: ast.expr) -> bool:
    """``logger.error``, ``logging.exception``, ``self._log.warning``: a
    logging call (what it logs never reaches the client)."""
    return (
        isinstance(func, ast.Attribute)
        and func.attr in _LOG_METHODS
        and "log" in _last(_dotted(func.value)).lower()
    )


def _reraises(handler: ast.ExceptHandler) -> bool:
    """Whether ``handler`` re-raises what it caught on some way out
    (``raise``, ``raise exc``), not counting nested handlers and functions."""
    stack: list[ast.AST] = list(handler.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Raise) and (
            node.exc is None
            or (isinstance(node.exc, ast.Name) and node.exc.id == handler.name)
        ):
            return True
        stack.extend(
            child
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, (*_SCOPES, ast.ExceptHandler))
        )
    return False
