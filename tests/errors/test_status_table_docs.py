"""``docs/errors/status-mapping.md`` is the status table, checked against the
code: every row of ``STATUS_TABLE`` and ``LEGACY_FALLBACKS`` (class, origin,
parent, status, public type, param, owner, message policy, retry guidance),
every upstream or Omni subclass that inherits a row, the framework statuses
and the retry rule. A row added, removed, reordered or changed on either side
fails here. Rows marked *vLLM X+* (``UPSTREAM_SINCE``: 0.32, 0.33, 0.34) are
compared where the installed vLLM defines their class and must be there
either way."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import vllm.exceptions

from vllm_omni import errors
from vllm_omni.errors import (
    VLLMError,
    for_caller,
    normalize,
    to_exception,
)
from vllm_omni.errors.details import STATUS_RANGES, OmniErrorDetails
from vllm_omni.errors.render import RETRY_AFTER_S, retry_headers, should_retry
from vllm_omni.errors.table import (
    HTTP_STATUS_TYPES,
    LEGACY_FALLBACKS,
    STATUS_TABLE,
    StatusRow,
    row_for,
)
from vllm_omni.errors.types import GRACEFUL_REBUILDS, REMOTE_TYPES, UPSTREAM_SINCE

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors" / "status-mapping.md"

# Modules whose VLLMError subclasses must each be documented, as a row or as
# an inherited row.
DOCUMENTED_MODULES = (
    "vllm.exceptions",
    "vllm.v1.engine.exceptions",
    "vllm.connections",
    "vllm_omni.errors.types",
)


def _since(name: str) -> str | None:
    """The vLLM release that added the upstream class ``name``, if newer than
    the oldest supported one; None for a class every supported vLLM has."""
    return UPSTREAM_SINCE.get(name)


def _installed(name: str) -> bool:
    return hasattr(vllm.exceptions, name)


_MARK = re.compile(r" \(vLLM (\d+\.\d+)\+\)$")


def markdown_table(heading: str) -> tuple[list[str], list[list[str]]]:
    """Header and body cells of the first table under ``heading``.

    A row whose cells say *vLLM X+* is kept only where the installed vLLM
    defines the class that row is about, with the mark cut off; the mark must
    name the release in ``UPSTREAM_SINCE``.
    """
    header, body = _markdown_table(heading)
    kept: list[list[str]] = []
    for row in body:
        marked = [(i, _MARK.search(cell)) for i, cell in enumerate(row)]
        marks = [(i, m) for i, m in marked if m is not None]
        if not marks:
            kept.append(row)
            continue
        name = next(n for n in re.findall(r"`(\w+)`", " ".join(row)) if _since(n))
        assert [m.group(1) for _, m in marks] == [_since(name)], row
        if _installed(name):
            cut = list(row)
            for i, m in marks:
                cut[i] = row[i][: m.start()]
            kept.append(cut)
    return header, kept


def _markdown_table(heading: str) -> tuple[list[str], list[list[str]]]:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    assert heading in lines, f"{DOC.name} has no heading {heading!r}"
    rows: list[list[str]] = []
    for line in lines[lines.index(heading) + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    header, separator, *body = rows
    assert all(set(cell) <= set("-: ") for cell in separator)
    assert all(len(row) == len(header) for row in body), heading
    return header, body


def _code(name: str) -> str:
    return f"`{name}`"


def _parent(exc_type: type[BaseException]) -> str:
    # Skip private mixins (the class-data mixin of the Omni types).
    public = [b for b in exc_type.__bases__ if not b.__name__.startswith("_")]
    return public[0].__name__


def _status(row: StatusRow) -> str:
    if row.status_attr:
        return f"`.{row.status_attr}` ({row.status_code} if unset)"
    return str(row.status_code)


def _error_type(row: StatusRow) -> str:
    if row.type_from_phrase:
        return "reason phrase of the status"
    if row.type_attr:
        return f"`.{row.type_attr}` (`{row.error_type}` if unset)"
    return _code(row.error_type)


def _owner(row: StatusRow) -> str:
    owner = row.category or "by status"
    return f"{owner}, fatal" if row.fatal else owner


_MESSAGE = {"own": "own text", "generic": "generic", "fixed": "`CLIENT_MESSAGE`"}


def _by_range(status: int) -> str:
    return next(c for c, statuses in STATUS_RANGES.items() if status in statuses)


def _flag(retry: bool) -> str:
    return f"`{str(retry).lower()}`"


def _retry(row: StatusRow) -> str:
    """The row's ``x-should-retry``: one value, or its default when an
    instance attribute may change the status (and so the decision)."""
    category = row.category or _by_range(row.status_code)
    record = OmniErrorDetails(
        "x", category, row.status_code, row.error_type, fatal=row.fatal
    )
    if row.status_attr or row.category is None:
        return f"by status ({_flag(should_retry(record))} if unset)"
    return _flag(should_retry(record))


def status_table_row(row: StatusRow) -> list[str]:
    exc_type = row.exc_type
    return [
        _code(exc_type.__name__),
        _code(exc_type.__module__),
        _code(_parent(exc_type)),
        _status(row),
        _error_type(row),
        _code(f".{row.parameter_attr}") if row.parameter_attr else "—",
        _owner(row),
        _MESSAGE[row.message],
        _retry(row),
    ]


def test_status_table() -> None:
    header, body = markdown_table("## Status table")
    assert header == [
        "Class",
        "Defined in",
        "Parent",
        "Status",
        "`error.type`",
        "`param`",
        "Owner",
        "Public message",
        "`x-should-retry`",
    ]
    assert body == [status_table_row(row) for row in STATUS_TABLE]
    assert not any(row.legacy_fallback for row in STATUS_TABLE)


def test_legacy_fallbacks() -> None:
    header, body = markdown_table("## Legacy fallbacks")
    assert header == [
        "Class",
        "Status",
        "`error.type`",
        "Owner",
        "Public message",
        "`x-should-retry`",
    ]
    assert body == [
        [
            _code(row.exc_type.__name__),
            _status(row),
            _error_type(row),
            _owner(row),
            _MESSAGE[row.message],
            _retry(row),
        ]
        for row in LEGACY_FALLBACKS
    ]
    assert all(row.legacy_fallback for row in LEGACY_FALLBACKS)


# Constructor arguments for the documented subclasses that need some.
_ARGS: dict[str, tuple[object, ...]] = {
    "LoRAAdapterNotFoundError": ("sql", "/adapters/sql"),
    "ChatTemplateResolutionError": ("no template",),
    "HTTPResponseSizeExceededError": (1024, 4096),
}


def _documented_subclasses() -> set[type[VLLMError]]:
    for module in DOCUMENTED_MODULES:
        importlib.import_module(module)
    found: set[type[VLLMError]] = set()
    pending: list[type[VLLMError]] = [VLLMError]
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            pending.append(sub)
            if sub.__module__ in DOCUMENTED_MODULES:
                found.add(sub)
    return found


def test_inherited_rows() -> None:
    header, body = markdown_table("## Inherited rows")
    assert header == [
        "Class",
        "Defined in",
        "Row used",
        "Status",
        "`error.type`",
        "Owner",
        "`x-should-retry`",
    ]
    with_rows = {row.exc_type for row in STATUS_TABLE}
    # Remote rebuilds have their own tables ("Records that crossed a
    # boundary", "Upstream refusals handed to Python callers").
    remote = set(REMOTE_TYPES.values()) | set(GRACEFUL_REBUILDS.values())
    inheriting = {
        cls
        for cls in _documented_subclasses()
        if cls not in with_rows and cls not in remote
    }
    assert sorted(row[0] for row in body) == sorted(
        _code(cls.__name__) for cls in inheriting
    ), "every upstream or Omni subclass without a row must be listed"
    by_name = {_code(cls.__name__): cls for cls in inheriting}
    for cells in body:
        cls = by_name[cells[0]]
        record = normalize(cls(*_ARGS.get(cls.__name__, ())))
        assert cells == [
            _code(cls.__name__),
            _code(cls.__module__),
            _code(row_for(cls).exc_type.__name__),
            str(record.status_code),
            _code(record.error_type),
            record.category,
            _flag(should_retry(record)),
        ]


def test_framework_statuses() -> None:
    header, body = markdown_table("## Framework errors")
    assert header == ["Status", "`error.type`", "`x-should-retry`"]
    assert body == [
        [
            str(status),
            _code(error_type),
            _flag(
                should_retry(
                    OmniErrorDetails("x", _by_range(status), status, error_type)
                )
            ),
        ]
        for status, error_type in HTTP_STATUS_TYPES.items()
    ]


# The retry rule, one documented row each: the record it describes.
_RULE_RECORDS: dict[str, list[OmniErrorDetails]] = {
    "client 408 or 429": [
        OmniErrorDetails("x", "client", status, "x") for status in (408, 429)
    ],
    "any other client record": [
        OmniErrorDetails("x", "client", status, "x")
        for status in (400, 401, 404, 405, 409, 413, 422, 499)
    ],
    "server, fatal": [
        OmniErrorDetails("x", "server", 500, "InternalServerError", fatal=True)
    ],
    "server 501": [OmniErrorDetails("x", "server", 501, "NotImplementedError")],
    "server 503, faulted": [
        OmniErrorDetails(
            "x", "server", 503, "ServiceUnavailableError", faulted=True, **delay
        )
        for delay in ({}, {"retry_after_s": 30})
    ],
    "any other server record": [
        OmniErrorDetails("x", "server", status, "x")
        for status in (500, 502, 503, 504, 599)
    ],
}


def test_retry_rule() -> None:
    header, body = markdown_table("## Retry guidance")
    assert header == [
        "Record",
        "`x-should-retry`",
        "`Retry-After`",
        "`retryable`",
        "Why",
    ]
    assert [cells[0] for cells in body] == list(_RULE_RECORDS)
    for kind, retry, retry_after, retryable, _why in body:
        for record in _RULE_RECORDS[kind]:
            headers = dict(retry_headers(record))
            assert retry == f"`{headers['x-should-retry']}`", kind
            if record.retry_after_s is not None:
                assert headers["Retry-After"] == str(record.retry_after_s)
                assert retry_after == f"`retry_after_s` ({RETRY_AFTER_S} if unset)"
            elif retry_after.startswith("`retry_after_s`"):
                assert headers["Retry-After"] == str(RETRY_AFTER_S), kind
            else:
                assert retry_after == (
                    str(RETRY_AFTER_S) if "Retry-After" in headers else "—"
                ), kind
            assert retryable == _flag(should_retry(record)), kind


def _record(kind: str) -> OmniErrorDetails:
    """A record of the kind a row of the records table describes."""
    if kind == "server, fatal":
        return OmniErrorDetails(
            "x", "server", 500, "InternalServerError", stage_id=1, fatal=True
        )
    if kind == "any other client record":
        return OmniErrorDetails("x", "client", 429, "RateLimitError")
    if kind.startswith("server with a `stage_id`"):
        return OmniErrorDetails("x", "server", 500, "InternalServerError", stage_id=1)
    if kind == "any other server record":
        return OmniErrorDetails("x", "server", 502, "Bad Gateway")
    if kind == "server 503, faulted":
        return OmniErrorDetails(
            "x", "server", 503, "ServiceUnavailableError", faulted=True
        )
    category, status, error_type = kind.split(" ")
    return OmniErrorDetails("x", category, int(status), error_type.strip("`"))


def test_upstream_refusals_table() -> None:
    header, body = markdown_table("## Upstream refusals handed to Python callers")
    assert header == ["Upstream original", "Exception raised", "Catch it as"]
    assert [cells[0] for cells in body] == [
        _code(cls.__name__) for cls in GRACEFUL_REBUILDS
    ]
    for original, exception, catch_as in body:
        upstream = getattr(vllm.exceptions, original.strip("`"))
        exc = for_caller(upstream(), request_id="r")
        assert exception == _code(type(exc).__name__)
        for name in catch_as.split(", "):
            catch = getattr(vllm.exceptions, name.strip("`"), None) or getattr(
                errors, name.strip("`")
            )
            assert isinstance(exc, catch), (original, name)


def test_to_exception_table() -> None:
    header, body = markdown_table("## Records that crossed a boundary")
    assert header == ["Record", "Exception raised", "Catch it as"]
    kinds = [cells[0] for cells in body]
    named = [f"{c} {s} `{t}`" for c, s, t in REMOTE_TYPES]
    assert set(named) <= set(kinds), "every REMOTE_TYPES row must be documented"
    faulted = [kind for kind in kinds if "faulted" in kind]
    assert len(kinds) == len(named) + 4 + len(faulted)
    assert len(faulted) == int(_installed("EngineFaultedError"))
    for record_kind, exception, catch_as in body:
        exc = to_exception(_record(record_kind))
        for name in catch_as.split(", "):
            catch = getattr(errors, name.strip("`"))
            assert isinstance(exc, catch), (record_kind, name)
        assert exception == _code(type(exc).__name__)


def test_a_faulted_record_is_rebuilt_by_what_this_vllm_defines() -> None:
    """0.34: its own class; 0.33 (no such class): by its shape, a 503."""
    record = _record("server 503, faulted")
    exc = to_exception(record)
    assert exc.details == record  # type: ignore[attr-defined]
    if _installed("EngineFaultedError"):
        assert type(exc).__name__ == "RemoteEngineFaultedError"
        assert isinstance(exc, vllm.exceptions.EngineFaultedError)
    else:
        assert type(exc).__name__ == "RemoteOmniServiceUnavailableError"
        assert not hasattr(errors, "EngineFaultedError")


_CLASS_RE = re.compile(r"^class (\w+)\(([^)]*)\):", re.MULTILINE)


def test_no_upstream_subclass_is_outside_the_documented_modules() -> None:
    """Every ``VLLMError`` subclass the installed vLLM defines anywhere (read
    from its source, so a module nobody imported counts too) is in a module
    whose classes the tables above cover, so each has a row or an inherited
    row: on 0.33, on 0.34 (``EngineFaultedError``), on any build."""
    root = Path(vllm.exceptions.__file__).parent
    defined: dict[str, str] = {}  # class -> module
    bases: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "Error" not in text:
            continue
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for name, base_text in _CLASS_RE.findall(text):
            names = {b.strip().rsplit(".", 1)[-1] for b in base_text.split(",")}
            bases.setdefault(name, set()).update(names)
            defined.setdefault(name, module)
    family = {"VLLMError"}
    grew = True
    while grew:
        grew = False
        for name, parents in bases.items():
            if name not in family and parents & family:
                family.add(name)
                grew = True
    outside = {
        name: defined[name]
        for name in family - {"VLLMError"}
        if defined[name] not in DOCUMENTED_MODULES
    }
    assert outside == {}, "document these modules' classes (DOCUMENTED_MODULES)"
    found = {cls.__name__ for cls in _documented_subclasses()}
    assert family - {"VLLMError"} <= found


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:2])


def test_older_releases_table() -> None:
    """Every ``UPSTREAM_SINCE`` name is in "Older vLLM releases" with its
    release, and is defined (and has its row) exactly where the installed
    vLLM is that release or newer."""
    header, body = _markdown_table("## Older vLLM releases")
    assert header == ["Upstream name", "Since", "Before it", "What stands in"]
    documented = {
        re.match(r"`(\w+)", cells[0]).group(1): cells[1]  # type: ignore[union-attr]
        for cells in body
        if cells[0].endswith("(`vllm.exceptions`)")
    }
    assert documented == UPSTREAM_SINCE
    installed = _release(importlib.import_module("vllm").__version__)
    rows = {row.exc_type.__name__ for row in STATUS_TABLE}
    for name, since in UPSTREAM_SINCE.items():
        present = installed >= _release(since)
        assert _installed(name) is present, name
        if name in ("RetryableRequestError", "EngineFaultedError"):
            assert (name in rows) is present, name
