"""This package is a drop-in for ``vllm_omni/errors.py`` of the 0.30.0 tree.

From the published wheel's source (``tests.wheel030``), with ``ast``, this
collects what 0.30's code uses of the errors module and checks each use
here, by meaning, not only by name:

(a) every name it imports from ``vllm_omni.errors``;
(b) every call of one of our exception types: its positional arguments and
    keywords bind to our constructor and mean the same (``error_stage_id=3``
    is stage 3 of the record);
(c) every attribute it reads from one of them (``except T as e: e.attr``,
    ``if isinstance(x, T): x.attr``, ``getattr(x, "attr", ...)``, parameters
    annotated with ``T``): it exists on every class of ours that is a ``T``
    and says what the record says;
(d) the error fields of its ``OmniRequestOutput`` and ``DiffusionOutput``
    and the classmethods that build a failed one: readable here, derived
    from ``details``, and read by 0.30's own consumer the same way.

Deprecated uses warn with one ``DeprecationWarning`` each; the others must
not warn. Each failure names the missing name, keyword or attribute and
the 0.30 file:line that uses it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import vllm_omni.errors as errors
from tests.wheel030 import errors_030, fields_030, function_030, methods_030, tree_030
from vllm_omni.errors import (
    OmniClientError,
    OmniEngineDeadError,
    OmniEngineGenerateError,
    OmniErrorDetails,
    OmniServerError,
    OmniServiceUnavailableError,
    OmniStageTimeoutError,
    normalize,
    to_exception,
)
from vllm_omni.errors.details import default_type
from vllm_omni.outputs import DiffusionOutput, OmniRequestOutput

# Our exception types, by the name 0.30's code knows them by.
TYPES: dict[str, type[BaseException]] = {
    name: value
    for name in errors.__all__
    if isinstance(value := getattr(errors, name), type)
    and issubclass(value, BaseException)
}
# The file this package replaces: its own uses are not uses of ours.
REPLACED = "errors.py"


@dataclass(frozen=True, slots=True, order=True)
class Use:
    """One use of the errors module by 0.30's code."""

    kind: str  # "import", "argument" or "attribute"
    owner: str  # the type (or types) it is used on; the module for imports
    # imported name; attribute; for a call its shape: one ``*`` per
    # positional argument, then the keywords (``*,error_stage_id``)
    name: str
    site: str  # 0.30 path:line


def _names(node: ast.AST | None) -> set[str]:
    """Type names an annotation, ``except`` clause or ``isinstance`` names."""
    if isinstance(node, ast.Name):
        return {node.id} & TYPES.keys()
    if isinstance(node, ast.Attribute):
        return {node.attr} & TYPES.keys()
    if isinstance(node, ast.Tuple):
        return set().union(*map(_names, node.elts))
    if isinstance(node, ast.BinOp):
        return _names(node.left) | _names(node.right)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return _names(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return set()
    return set()


def _narrowed(test: ast.expr) -> dict[str, set[str]]:
    """Names an ``if`` test proves to be one of our types (``isinstance``,
    alone or in an ``and`` chain)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        found: dict[str, set[str]] = {}
        for value in test.values:
            found |= _narrowed(value)
        return found
    if (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == "isinstance"
        and len(test.args) == 2
        and isinstance(test.args[0], ast.Name)
    ):
        names = _names(test.args[1])
        return {test.args[0].id: names} if names else {}
    return {}


class _Collector:
    """Walks one 0.30 file, knowing at each point which local names hold
    one of our exception types (flow-sensitive enough for 0.30's code)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.uses: list[Use] = []

    def _use(self, kind: str, owner: set[str], name: str, node: ast.AST) -> None:
        site = f"{self.path}:{getattr(node, 'lineno', 0)}"
        self.uses.append(Use(kind, "|".join(sorted(owner)), name, site))

    def module(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "vllm_omni.errors":
                for alias in node.names:
                    self._use("import", {"vllm_omni.errors"}, alias.name, node)
        self.block(tree.body, {})

    def block(self, body: list[ast.stmt], env: dict[str, set[str]]) -> None:
        env = dict(env)
        for statement in body:
            self.statement(statement, env)

    def statement(self, node: ast.stmt, env: dict[str, set[str]]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            scope = {
                a.arg: _names(a.annotation)
                for a in (
                    *arguments.posonlyargs,
                    *arguments.args,
                    *arguments.kwonlyargs,
                )
                if _names(a.annotation)
            }
            for expr in (*node.decorator_list, *arguments.defaults):
                self.expression(expr, env)
            self.block(node.body, scope)
        elif isinstance(node, ast.ClassDef):
            self.block(node.body, {})
        elif isinstance(node, ast.If):
            narrowed = _narrowed(node.test)
            self.expression(node.test, env | narrowed)
            self.block(node.body, env | narrowed)
            self.block(node.orelse, env)
        elif isinstance(node, ast.Try | ast.TryStar):
            self.block(node.body, env)
            for handler in node.handlers:
                caught = _names(handler.type)
                inner = env | (
                    {handler.name: caught} if handler.name and caught else {}
                )
                self.block(handler.body, inner)
            self.block(node.orelse, env)
            self.block(node.finalbody, env)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    self.statement(child, env)
                elif isinstance(child, ast.expr):
                    self.expression(child, env)
                elif isinstance(child, ast.withitem | ast.match_case):
                    for part in ast.iter_child_nodes(child):
                        if isinstance(part, ast.stmt):
                            self.statement(part, env)
                        elif isinstance(part, ast.expr):
                            self.expression(part, env)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                made = _names(node.value.func)
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        if made:
                            env[target.id] = made
                        else:
                            env.pop(target.id, None)

    def expression(self, node: ast.expr, env: dict[str, set[str]]) -> None:
        for child in ast.walk(node):
            if isinstance(child, ast.Call):
                self.call(child, env)
            elif (
                isinstance(child, ast.Attribute)
                and isinstance(child.ctx, ast.Load)
                and isinstance(child.value, ast.Name)
                and child.value.id in env
            ):
                self._use("attribute", env[child.value.id], child.attr, child)

    def call(self, node: ast.Call, env: dict[str, set[str]]) -> None:
        func = node.func
        made = _names(func) if isinstance(func, ast.Name | ast.Attribute) else set()
        if made and not any(isinstance(a, ast.Starred) for a in node.args):
            keywords = [k.arg for k in node.keywords]
            if None not in keywords:  # no ``**kwargs``: the shape is known
                shape = ",".join([*("*" * len(node.args)), *sorted(map(str, keywords))])
                self._use("argument", made, shape, node)
        if (
            isinstance(func, ast.Name)
            and func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in env
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            self._use("attribute", env[node.args[0].id], node.args[1].value, node)


# Every use is by name, so a file that names none of ours has none (this
# skips parsing most of the 1,609 files).
_MENTIONS = re.compile(
    "|".join(map(re.escape, sorted({*TYPES, "vllm_omni.errors"}))).encode()
)


def _collect() -> Iterator[Use]:
    root = tree_030()
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative == REPLACED or not _MENTIONS.search(path.read_bytes()):
            continue
        collector = _Collector(relative)
        collector.module(ast.parse(path.read_bytes(), filename=str(path)))
        yield from collector.uses


@pytest.fixture(scope="module")
def uses() -> list[Use]:
    return sorted(set(_collect()))


def _by_name(uses: list[Use], kind: str) -> dict[tuple[str, str], list[str]]:
    """``(owner, name)`` → the 0.30 sites, for one kind of use."""
    found: dict[tuple[str, str], list[str]] = {}
    for use in uses:
        if use.kind == kind:
            found.setdefault((use.owner, use.name), []).append(use.site)
    return found


def _warnings(
    action: Callable[..., Any], *args: Any, **kwargs: Any
) -> tuple[Any, list[warnings.WarningMessage]]:
    """``action(*args, **kwargs)`` and the DeprecationWarnings it emitted."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = action(*args, **kwargs)
    return result, [w for w in caught if issubclass(w.category, DeprecationWarning)]


# -- (a) imports ----------------------------------------------------------------

# Names 0.30's code imports that are deprecated here: accessing one warns.
DEPRECATED_NAMES = {"DEFAULT_CLIENT_ERROR_TYPE"}


def test_the_030_tree_imports_are_collected(uses: list[Use]) -> None:
    """The collector sees the imports a grep of the wheel shows (so a
    passing test below is not an empty loop)."""
    imported = {name for owner, name in _by_name(uses, "import")}
    assert imported >= {"OmniClientError", "DEFAULT_CLIENT_ERROR_TYPE"}
    assert len(imported) >= 7


def test_every_name_the_030_tree_imports_exists_here(uses: list[Use]) -> None:
    old = errors_030()
    missing, wrong = [], []
    for (_, name), sites in sorted(_by_name(uses, "import").items()):
        value, caught = _warnings(getattr, errors, name, None)
        if value is None:
            missing.append(f"{name} (imported at {', '.join(sites[:3])})")
            continue
        expected_warnings = 1 if name in DEPRECATED_NAMES else 0
        if len(caught) != expected_warnings:
            wrong.append(f"{name}: {len(caught)} DeprecationWarning(s) on access")
        original = getattr(old, name)
        if isinstance(original, str) and value != original:
            wrong.append(f"{name} = {value!r}, 0.30 has {original!r}")
        if callable(original) and not callable(value):
            wrong.append(f"{name} is not callable here")
    assert not missing, "0.30 imports names this package lacks: " + "; ".join(missing)
    assert not wrong, "; ".join(wrong)


# Ancestors a 0.30 class had that ours deliberately lacks, and where that
# change is recorded; any other lost ancestor fails the test below.
DELIBERATE_BREAKS: dict[str, dict[str, str]] = {
    "OmniClientError": {"ValueError": "docs/design.md §2: no longer a ValueError"},
    "GuardrailViolationError": {
        "OmniClientError": "CHANGELOG: a direct VLLMClientError (400)",
        "ValueError": "docs/design.md §2, through OmniClientError",
    },
}


def test_every_030_class_keeps_its_ancestors_and_status(uses: list[Use]) -> None:
    """``except`` clauses of 0.30 catch what they caught, and a bare
    instance has 0.30's status, but for the recorded breaks."""
    old = errors_030()
    problems = []
    for _, name in _by_name(uses, "import"):
        original = getattr(old, name)
        if not isinstance(original, type):
            continue
        mine = TYPES[name]
        kept = {c.__name__ for c in mine.__mro__}
        lost = {c.__name__ for c in original.__mro__} - kept - {name}
        lost -= set(DELIBERATE_BREAKS.get(name, {}))
        if lost:
            problems.append(f"{name} is no longer a {sorted(lost)}")
        if normalize(mine(TEXT)).status_code != original(TEXT).status_code:
            problems.append(f"{name}: another status than 0.30's")
    assert not problems, "; ".join(problems)


def test_a_deprecated_name_warns_at_the_importing_line() -> None:
    with pytest.warns(DeprecationWarning, match="DEFAULT_CLIENT_ERROR_TYPE") as caught:
        from vllm_omni.errors import DEFAULT_CLIENT_ERROR_TYPE
    assert DEFAULT_CLIENT_ERROR_TYPE == "BadRequestError"
    assert [w.filename for w in caught] == [__file__]
    # Not cached: every access warns (Python shows it once per line).
    _, again = _warnings(lambda: errors.DEFAULT_CLIENT_ERROR_TYPE)
    assert len(again) == 1


# -- (b) constructor calls ----------------------------------------------------------

# What a 0.30 call passes, and what it must mean here: (value to pass, check
# on the built exception and its record).
Check = Callable[[Any, OmniErrorDetails], bool]
TEXT = "0.30 text"
ARGUMENTS: dict[str, tuple[object, Check]] = {
    "status_code": (404, lambda exc, d: exc.status_code == d.status_code == 404),
    "error_type": (
        "NotFoundError",
        lambda exc, d: exc.error_type == d.error_type == "NotFoundError",
    ),
    "error_stage_id": (3, lambda exc, d: exc.stage_id == d.stage_id == 3),
}
# 0.30 forms that are deprecated here: a call using any warns once.
DEPRECATED_ARGUMENTS = {
    ("OmniEngineDeadError", "*"),
    ("OmniEngineDeadError", "error_stage_id"),
}


def _positional_meaning(exc: Any, details: OmniErrorDetails) -> bool:
    """A 0.30 message: the public text, or for a dead engine (whose public
    text is fixed) the log text of the death, ``reason``."""
    if details.fatal:
        return bool(exc.reason == TEXT and TEXT in str(exc))
    return details.message == TEXT


def _ours(cls: type[BaseException]) -> bool:
    return cls.__module__.startswith("vllm_omni.")


def test_the_030_calls_are_collected(uses: list[Use]) -> None:
    shapes = _by_name(uses, "argument")
    assert ("OmniEngineDeadError", "*,error_stage_id") in shapes
    assert len(shapes[("OmniClientError", "*")]) > 100


def test_every_030_call_of_our_types_binds_and_means_the_same(uses: list[Use]) -> None:
    problems = []
    for (owner, shape), sites in sorted(_by_name(uses, "argument").items()):
        cls = TYPES[owner]
        parts = shape.split(",") if shape else []
        positional = [TEXT] * parts.count("*")
        keywords = [p for p in parts if p != "*"]
        unknown = [k for k in keywords if k not in ARGUMENTS]
        where = f"{owner}({shape}) at {', '.join(sites[:2])}"
        if unknown:
            problems.append(f"{where}: no meaning known for {unknown}")
            continue
        kwargs = {k: ARGUMENTS[k][0] for k in keywords}
        try:
            inspect.signature(cls).bind(*positional, **kwargs)
        except TypeError as exc:
            problems.append(f"{where}: does not bind here ({exc})")
            continue
        if not _ours(cls):
            continue  # upstream's own class, re-exported by identity
        exc, caught = _warnings(cls, *positional, **kwargs)
        details = normalize(exc)
        deprecated = {(owner, p) for p in set(parts)} & DEPRECATED_ARGUMENTS
        if len(caught) != (1 if deprecated else 0):
            problems.append(f"{where}: {len(caught)} DeprecationWarning(s)")
        if positional and not _positional_meaning(exc, details):
            problems.append(f"{where}: the message does not mean the same")
        problems += [
            f"{where}: {k}= does not mean the same"
            for k in keywords
            if not ARGUMENTS[k][1](exc, details)
        ]
    assert not problems, "\n".join(problems)


# -- (c) attributes -----------------------------------------------------------------


def _records() -> list[OmniErrorDetails]:
    return [
        OmniErrorDetails("no voice", "client", 404, "NotFoundError", stage_id=2),
        OmniErrorDetails("bad", "client", 400, "BadRequestError", parameter="seed"),
        OmniErrorDetails("busy", "client", 409, "ConflictError", request_id="r"),
        OmniErrorDetails("too big", "client", 413, "PayloadTooLarge", stage_id=1),
        OmniErrorDetails("blocked", "client", 400, "GuardrailViolationError"),
        OmniErrorDetails("failed", "server", 500, "InternalServerError", stage_id=2),
        OmniErrorDetails(
            "drained", "server", 503, "ServiceUnavailableError", stage_id=1
        ),
        OmniErrorDetails("slow", "server", 504, "GatewayTimeoutError", stage_id=1),
        OmniErrorDetails("handoff", "server", 502, "NativeKVHandoffError", stage_id=4),
        OmniErrorDetails(
            "dead", "server", 500, "InternalServerError", stage_id=2, fatal=True
        ),
    ]


def _samples() -> list[BaseException]:
    """Instances of our types as 0.30's code would meet them: rebuilt from
    records (every ``Remote*`` class and wrapper) and raised directly."""
    return [
        *(to_exception(record, reason="gone") for record in _records()),
        OmniClientError("no voice", status_code=404),
        OmniServerError("handoff", status_code=502, error_type="NativeKVHandoffError"),
        OmniEngineDeadError(stage_id=2, reason="gone"),
        OmniEngineGenerateError("failed", stage_id=2),
        OmniServiceUnavailableError("drained", stage_id=1),
        OmniStageTimeoutError("slow", stage_id=1),
    ]


# What an attribute 0.30 reads must say, given the instance's record.
ATTRIBUTES: dict[str, Callable[[Any, OmniErrorDetails], bool]] = {
    "status_code": lambda value, d: value == d.status_code,
    "error_type": lambda value, d: value == d.error_type,
    "message": lambda value, d: value == d.message,
    "error_stage_id": lambda value, d: value == d.stage_id,
}
DEPRECATED_ATTRIBUTES = {"error_stage_id"}


def test_the_030_attribute_reads_are_collected(uses: list[Use]) -> None:
    reads = _by_name(uses, "attribute")
    assert ("EngineDeadError|EngineGenerateError", "error_stage_id") in reads
    assert ("OmniClientError", "status_code") in reads


def test_every_attribute_the_030_tree_reads_exists_here(uses: list[Use]) -> None:
    samples = _samples()
    problems = []
    for (owner, name), sites in sorted(_by_name(uses, "attribute").items()):
        where = f"{owner}.{name} (read at {', '.join(sites[:2])})"
        meaning = ATTRIBUTES.get(name)
        if meaning is None:
            problems.append(f"{where}: no meaning known")
            continue
        kinds = set(owner.split("|"))
        matching = [s for s in samples if kinds & {c.__name__ for c in type(s).__mro__}]
        if not matching:
            problems.append(f"{where}: no class of ours is one")
        for sample in matching:
            details = normalize(sample)
            label = f"{where} on {type(sample).__name__}"
            value, caught = _warnings(getattr, sample, name, AttributeError)
            if value is AttributeError:
                problems.append(f"{label}: missing")
                continue
            if len(caught) != (1 if name in DEPRECATED_ATTRIBUTES else 0):
                problems.append(f"{label}: {len(caught)} DeprecationWarning(s)")
            if not meaning(value, details):
                problems.append(f"{label}: {value!r} does not match {details}")
    assert not problems, "\n".join(problems)


# -- (d) output fields and constructors --------------------------------------------

OUTPUTS = {
    "OmniRequestOutput": ("outputs/__init__.py", OmniRequestOutput),
    "DiffusionOutput": ("diffusion/data.py", DiffusionOutput),
}
# A 0.30 flat error field → the record field it reads.
FLAT = {
    "error": "message",
    "error_status_code": "status_code",
    "error_type": "error_type",
}
FAILED = OmniErrorDetails("no voice", "client", 404, "NotFoundError", request_id="r-1")


def _flat_fields(name: str) -> list[str]:
    relative, _ = OUTPUTS[name]
    return [f for f in fields_030(relative, name) if f.startswith("error")]


def _error_builders(name: str) -> list[ast.FunctionDef]:
    """0.30 methods that build a failed output (a call with ``error=``)."""
    relative, _ = OUTPUTS[name]
    return [
        method
        for method in methods_030(relative, name)
        if any(
            isinstance(n, ast.Call) and any(k.arg == "error" for k in n.keywords)
            for n in ast.walk(method)
        )
    ]


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_the_030_flat_error_fields_are_derived_from_details(name: str) -> None:
    _, ours = OUTPUTS[name]
    fields = _flat_fields(name)
    assert fields == ["error", "error_status_code", "error_type"]
    stored = {f.name for f in dataclasses.fields(ours)}
    failed = (
        OmniRequestOutput("r-1", details=FAILED)
        if ours is OmniRequestOutput
        else DiffusionOutput(details=FAILED)
    )
    ok = OmniRequestOutput("r-2") if ours is OmniRequestOutput else DiffusionOutput()
    problems = []
    for field in fields:
        if field in stored or not isinstance(
            inspect.getattr_static(ours, field, None), property
        ):
            problems.append(f"{name}.{field}: not a property derived from details")
            continue
        value, caught = _warnings(getattr, failed, field)
        if value != getattr(FAILED, FLAT[field]):
            problems.append(f"{name}.{field} = {value!r}")
        if len(caught) != 1:
            problems.append(f"{name}.{field}: {len(caught)} DeprecationWarning(s)")
        none, _ = _warnings(getattr, ok, field)
        if none is not None:
            problems.append(f"{name}.{field} of a success = {none!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_the_030_error_constructors_exist_with_their_signature(name: str) -> None:
    _, ours = OUTPUTS[name]
    builders = _error_builders(name)
    assert builders, f"0.30 {name} builds no failed output?"
    problems = []
    for method in builders:
        mine = getattr(ours, method.name, None)
        if mine is None:
            problems.append(f"{name}.{method.name}: missing")
            continue
        arguments = method.args
        required = len(arguments.args) - len(arguments.defaults) - 1  # cls
        positional = [TEXT] * required
        keywords = {a.arg: None for a in arguments.args[1 + required :]}
        keywords |= {a.arg: None for a in arguments.kwonlyargs}
        try:
            inspect.signature(mine).bind(*positional, **keywords)
        except TypeError as exc:
            problems.append(f"{name}.{method.name}: does not bind ({exc})")
    assert not problems, "\n".join(problems)


def _outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    """What 0.30's consumer does with an output: nothing, or which class of
    ours it raises with which status, type and text."""
    try:
        _warnings(call)
    except OmniClientError as exc:
        return (type(exc).__name__, exc.status_code, exc.error_type, exc.message)
    except Exception as exc:
        return (type(exc).__name__,)
    return ("ok",)


@pytest.mark.parametrize(
    ("message", "status", "error_type"),
    [
        ("no voice", 404, "NotFoundError"),
        ("busy", 409, None),
        ("stage failed", None, None),
        ("kv handoff", 502, "NativeKVHandoffError"),
        ("odd", None, "BadRequestError"),
    ],
)
def test_from_error_is_read_by_030s_consumer_as_030s_own(
    message: str, status: int | None, error_type: str | None
) -> None:
    """0.30's ``OmniRequestOutput.from_error`` and ours, each read by 0.30's
    ``OmniBase._check_engine_output_error`` running against this package
    (as it would once this package replaced its ``errors.py``)."""
    old_from_error = function_030(
        "outputs/__init__.py", "OmniRequestOutput", "from_error", {}
    )
    check = function_030(
        "entrypoints/omni_base.py",
        "OmniBase",
        "_check_engine_output_error",
        {
            "logger": _QuietLogger(),
            "OmniEngineDeadError": OmniEngineDeadError,
            "raise_client_error_or": errors.raise_client_error_or,
            "EngineGenerateError": errors.EngineGenerateError,
        },
    )
    engine = _Engine030()
    old = _Flat(
        **old_from_error(
            _Flat, "r-1", message, status_code=status, error_type=error_type
        )
    )
    ours, caught = _warnings(
        lambda: OmniRequestOutput.from_error(
            "r-1", message, status_code=status, error_type=error_type
        )
    )
    assert len(caught) == 1
    assert ours.finished and ours.request_id == "r-1" and ours.details is not None
    expected = _outcome(lambda: check(engine, _Result(old), "r-1", 0))
    got = _outcome(lambda: check(engine, _Result(ours), "r-1", 0))
    if status is not None and status < 500:
        assert got == expected  # the same client error: status, type, text
        assert (ours.details.category, ours.details.error_type) == (
            "client",
            error_type or default_type(status),
        )
    else:
        # 0.30 raised its fallback for a server status; so it does for ours.
        assert got == expected == ("EngineGenerateError",)
        assert ours.details.category == "server"
    # A success is no error to 0.30's consumer either.
    assert _outcome(
        lambda: check(engine, _Result(OmniRequestOutput("r-2")), "r-2", 0)
    ) == ("ok",)


@pytest.mark.parametrize(
    "exc",
    [
        OmniClientError("no voice", status_code=404, error_type="NotFoundError"),
        OmniClientError("bad seed"),
        RuntimeError("boom at /home/alice/model.bin"),
        OmniEngineGenerateError("stage failed", stage_id=1),
    ],
    ids=["404", "400", "unknown", "stage-500"],
)
def test_from_exception_is_read_by_030s_consumer_as_030s_own(exc: Exception) -> None:
    """0.30's ``DiffusionOutput.from_exception`` (running against this
    package's ``client_error_metadata``) and ours, read the way 0.30's
    ``DiffusionEngine.postprocess_output`` reads a failed output."""
    old_from_exception = function_030(
        "diffusion/data.py",
        "DiffusionOutput",
        "from_exception",
        {"client_error_metadata": errors.client_error_metadata},
    )
    old = _Flat(**_warnings(lambda: old_from_exception(_Flat, exc))[0])
    ours, caught = _warnings(lambda: DiffusionOutput.from_exception(exc))
    assert len(caught) == 1
    assert ours.details == normalize(exc)

    def consume(output: Any) -> Callable[[], Any]:
        return lambda: errors.raise_client_error_or(
            output.error,
            status_code=output.error_status_code,
            error_type=output.error_type,
            fallback=RuntimeError,
        )

    expected = _outcome(consume(old))
    got = _outcome(consume(ours))
    if isinstance(exc, OmniClientError):
        assert got == expected  # owner, status, type and text
    else:
        assert got == expected == ("RuntimeError",)


class _Flat(dict[str, Any]):
    """A 0.30 output's fields (``cls(**fields)`` of its constructors), read
    as attributes by its consumers."""

    def __getattr__(self, name: str) -> Any:
        return self.get(name)


@dataclass
class _Result:
    """0.30's ``OutputMessage`` as its consumer reads it."""

    engine_outputs: Any


class _Engine030:
    """The ``self`` of 0.30's ``OmniBase`` methods: a live engine."""

    errored = False


class _QuietLogger:
    def error(self, *args: object) -> None:
        """0.30 logs the stage error; nothing to check here."""
