"""The audit's rules and name tables: what counts, as data.

Owns the rule ids with their texts (every output format and
``docs/errors/migration.md`` use them), and the tables the scanner reads:
which exception names are raw, semantic or client errors, which callables
carry an HTTP status, which decorators legitimately raise a raw type, and
which semantic type to suggest for a status or a message.

It must not import anything outside the standard library: the audit has to
run without vLLM, torch, FastAPI or vllm-omni installed. The status table
of ``vllm_omni.errors.table`` imports vLLM, so the audit keeps the small name
tables it needs here instead of reading that module; ``tests/
test_runtime_tables.py`` checks that they agree where both are installed.
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass
from typing import Literal

Level = Literal["error", "warning", "note"]

DOCS_URI = (
    "https://github.com/vllm-project/vllm-omni/blob/main/docs/errors/migration.md"
)


@dataclass(frozen=True, slots=True)
class Rule:
    """One audit rule, with the texts every output format shows."""

    id: str
    name: str
    summary: str
    description: str
    help: str
    level: Level
    # Rules about things only ``vllm_omni/errors`` may do (build statuses,
    # HTTPExceptions, error responses) do not apply inside that package.
    owned_by_errors_package: bool = False


RULES: tuple[Rule, ...] = (
    Rule(
        id="OMNI000",
        name="parse-error",
        summary="File could not be parsed.",
        description=(
            "The file is not valid Python for this interpreter, or its bytes "
            "do not decode in the declared encoding (UTF-8 when none is "
            "declared), so none of its raise sites could be audited."
        ),
        help="Fix the syntax error, or save the file as UTF-8.",
        level="error",
    ),
    Rule(
        id="OMNI001",
        name="raw-raise",
        summary="Raw ValueError/TypeError/OverflowError/NotImplementedError raise.",
        description=(
            "These builtins have a status only through the legacy raw-exception "
            "fallback (400, or 501 for NotImplementedError) and are a server "
            "error (500) in strict mode, so their status depends on the mode. "
            "Raise a semantic type that states who is at fault."
        ),
        help=(
            "Request input the caller can fix: VLLMValidationError(message, "
            "parameter=...). Missing model/voice/job: VLLMNotFoundError. "
            "Undecodable media: VLLMUnprocessableEntityError. Unimplemented "
            "operation: OmniNotImplementedError. An internal invariant: "
            "RuntimeError or an assert (a server error, as it should be)."
        ),
        level="warning",
    ),
    Rule(
        id="OMNI002",
        name="broad-except-client-error",
        summary="Broad except turned into a client (4xx) error.",
        description=(
            "An except clause for ValueError, TypeError, OverflowError, "
            "Exception or a bare except raises or returns a 4xx error, so every "
            "internal failure in the try block is reported as the caller's "
            "fault."
        ),
        help=(
            "Raise VLLMValidationError where the input is validated and catch "
            "VLLMClientError (or let it propagate); everything else stays a "
            "server error."
        ),
        level="error",
        owned_by_errors_package=True,
    ),
    Rule(
        id="OMNI003",
        name="error-response-without-status",
        summary="Error response returned without an explicit HTTP status.",
        description=(
            "A function returns ErrorResponse, create_error_response(...) or a "
            "JSONResponse error body without status_code; FastAPI sends such a "
            "body with HTTP 200 unless every caller converts it."
        ),
        help=(
            "Raise the semantic exception instead; vllm_omni.errors renders it "
            "with the right status on every transport."
        ),
        level="error",
        owned_by_errors_package=True,
    ),
    Rule(
        id="OMNI004",
        name="status-range-guess",
        summary="Error ownership guessed from a numeric status range.",
        description=(
            "A comparison such as 400 <= status < 500, status // 100 == 4 or "
            "is_client_error_status(status) derives client/server ownership "
            "from a status chosen earlier, so a wrong status cannot be "
            "recovered."
        ),
        help="Read OmniErrorDetails.category, or catch VLLMClientError.",
        level="warning",
        owned_by_errors_package=True,
    ),
    Rule(
        id="OMNI005",
        name="http-exception",
        summary="HTTPException raised outside vllm_omni/errors.",
        description=(
            "fastapi/starlette HTTPException builds a status and a body outside "
            "the one renderer, bypassing the canonical envelope, sanitization "
            "and the error metrics."
        ),
        help="Raise the semantic exception for that status (see the suggestion).",
        level="warning",
        owned_by_errors_package=True,
    ),
)

RULES_BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}
PARSE_ERROR, RAW_RAISE, BROAD_EXCEPT, ERROR_RESPONSE, STATUS_RANGE, HTTP_EXC = (
    rule.id for rule in RULES
)

# Raising one of these is an OMNI001 finding: upstream's legacy fallback maps
# them to 400 (501 for NotImplementedError). The Unicode errors are builtin
# ValueError subclasses and reach the same fallback. RuntimeError, Exception,
# KeyError, AttributeError, ... are inventory only: they are a server error
# in every mode, which is right for internal invariants.
RAW_RAISE_SUGGESTIONS: dict[str, str] = {
    "ValueError": "VLLMValidationError",
    "TypeError": "VLLMValidationError",
    "OverflowError": "VLLMValidationError",
    "NotImplementedError": "OmniNotImplementedError",
    "UnicodeError": "VLLMUnprocessableEntityError",
    "UnicodeDecodeError": "VLLMUnprocessableEntityError",
    "UnicodeEncodeError": "VLLMUnprocessableEntityError",
    "UnicodeTranslateError": "VLLMUnprocessableEntityError",
}

# Words in a raw raise's message that point at a more specific type than the
# default above; the first matching row wins. Words match whole (``timeout``
# does not match ``heartbeat_timeout``, ``decode`` not ``decoder``). Rows
# marked True name a runtime state (a deadline passed, a service is down, a
# job is busy) and do not apply to a message stating a constraint.
MESSAGE_HINTS: tuple[tuple[tuple[str, ...], str, bool], ...] = (
    (
        ("not found", "does not exist", "no such", "unknown model"),
        "VLLMNotFoundError",
        False,
    ),
    (("timed out", "timeout", "deadline"), "OmniStageTimeoutError", True),
    (
        ("unavailable", "not ready", "not running"),
        "OmniServiceUnavailableError",
        True,
    ),
    (("conflict", "already running", "already completed"), "OmniConflictError", True),
    (
        ("decode", "corrupt", "corrupted", "cannot open", "undecodable"),
        "VLLMUnprocessableEntityError",
        False,
    ),
    (("not implemented",), "OmniNotImplementedError", False),
)
# A message that states a constraint on a value ("heartbeat_timeout must be
# positive", "timeout must be > 0") is a validation failure, not a timeout.
VALIDATION_PHRASES: tuple[str, ...] = (
    "must be",
    "must not",
    "should be",
    "cannot be",
    "can't be",
    "expected",
    "invalid",
    "positive",
    "negative",
    "greater than",
    "less than",
    "at least",
    "at most",
)
_HINT_PATTERNS = tuple(
    (
        re.compile(r"\b(?:" + "|".join(map(re.escape, words)) + r")\b"),
        suggestion,
        state,
    )
    for words, suggestion, state in MESSAGE_HINTS
)
_VALIDATION_PATTERN = re.compile(
    r"\b(?:" + "|".join(map(re.escape, VALIDATION_PHRASES)) + r")\b"
)

# Upstream (vllm.exceptions, vllm.v1.engine.exceptions) and Omni (docs/design.md §2)
# semantic types. Raising them is what the migration aims for.
CLIENT_ERROR_TYPES: frozenset[str] = frozenset(
    {
        "VLLMClientError",
        "VLLMValidationError",
        "VLLMNotFoundError",
        "VLLMUnprocessableEntityError",
        "ChatTemplateResolutionError",
        "LoRAAdapterNotFoundError",
        "GuardrailViolationError",
        "OmniConflictError",
        "OmniClientError",
    }
)
SEMANTIC_TYPES: frozenset[str] = CLIENT_ERROR_TYPES | {
    "VLLMError",
    "VLLMServerError",
    "GenerationError",
    "RetryableRequestError",
    "GracefulHTTPError",
    "QueueOverflowError",
    "MaxQueuedTokensError",
    "ProfilerAlreadyActiveError",
    "EngineGenerateError",
    "EngineDeadError",
    "OmniNotImplementedError",
    "OmniServiceUnavailableError",
    "OmniStageTimeoutError",
    "OmniEngineGenerateError",
    "OmniEngineDeadError",
    "OmniServerError",
}
BUILTIN_EXCEPTIONS: frozenset[str] = frozenset(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
)

# An except clause catching any of these (or a bare except) is broad: it also
# catches internal failures of everything called in the try block.
BROAD_CATCH_TYPES: frozenset[str] = frozenset(
    {
        "ValueError",
        "TypeError",
        "OverflowError",
        "NotImplementedError",
        "Exception",
        "BaseException",
    }
)


@dataclass(frozen=True, slots=True)
class StatusCarrier:
    """Where a callable takes its HTTP status, and what it is when omitted."""

    position: int | None
    keyword: str
    default: int | None


_RESPONSE = StatusCarrier(position=1, keyword="status_code", default=200)
# Callables whose call fixes an HTTP status (fastapi/starlette responses and
# exceptions, vLLM's error helpers, the compat OmniClientError).
STATUS_CARRIERS: dict[str, StatusCarrier] = {
    "HTTPException": StatusCarrier(position=0, keyword="status_code", default=None),
    "create_error_response": StatusCarrier(
        position=2, keyword="status_code", default=400
    ),
    "ErrorInfo": StatusCarrier(position=None, keyword="code", default=None),
    "OmniClientError": StatusCarrier(position=None, keyword="status_code", default=400),
    **{
        name: _RESPONSE
        for name in (
            "Response",
            "JSONResponse",
            "ORJSONResponse",
            "UJSONResponse",
            "PlainTextResponse",
            "HTMLResponse",
        )
    },
}
RESPONSE_CLASSES: frozenset[str] = frozenset(
    name for name, carrier in STATUS_CARRIERS.items() if carrier is _RESPONSE
)
# Returning one of these leaves the HTTP status to whoever receives it.
ERROR_MODEL_BUILDERS: frozenset[str] = frozenset(
    {"ErrorResponse", "create_error_response"}
)
# A response body is an error body when it has one of these keys or mentions
# an identifier containing "error" (or one of the usual exception names).
ERROR_BODY_KEYS: frozenset[str] = frozenset({"error", "detail"})
ERROR_IDENTIFIERS: frozenset[str] = frozenset({"err", "exc"})

# Decorated functions in which raising a raw type is a protocol, not a status
# decision. An abstract method's ``raise NotImplementedError`` directly in its
# body (not inside an ``if``: a conditional raise is a real decision).
DIRECT_BODY_EXEMPTIONS: dict[str, frozenset[str]] = {
    "abstractmethod": frozenset({"NotImplementedError"}),
}
# Pydantic validators, anywhere in their body: pydantic turns ValueError, and
# only ValueError, into a ValidationError. attrs validators (``@x.validator``)
# are not exempt: attrs converts nothing.
DECORATOR_EXEMPTIONS: dict[str, frozenset[str]] = {
    "field_validator": frozenset({"ValueError"}),
    "model_validator": frozenset({"ValueError"}),
    "validator": frozenset({"ValueError"}),
    "root_validator": frozenset({"ValueError"}),
}
_PYDANTIC_ONLY_VALIDATORS = frozenset({"field_validator", "model_validator"})


def is_converting_validator(qualname: str) -> bool:
    """Whether a decorator (its resolved dotted name) is a pydantic validator.

    ``field_validator``/``model_validator`` are pydantic's names; the generic
    ``validator``/``root_validator`` count only bare or imported from
    pydantic, never as an attribute of something else (attrs' ``@x.validator``).
    """
    head, _, name = qualname.rpartition(".")
    if name not in DECORATOR_EXEMPTIONS:
        return False
    return (
        name in _PYDANTIC_ONLY_VALIDATORS
        or not head
        or head.partition(".")[0] == "pydantic"
    )


# Status-range guessing: the bounds of the 4xx and 5xx classes, the class
# digits of ``status // 100``, and helpers that classify by range.
STATUS_BOUNDS: frozenset[int] = frozenset({399, 400, 499, 500, 599, 600})
STATUS_CLASS_DIGITS: frozenset[int] = frozenset({4, 5})
STATUS_RANGE_CALLS: frozenset[str] = frozenset(
    {"is_client_error_status", "is_server_error_status"}
)
STATUS_RANGE_ATTRIBUTES: frozenset[str] = frozenset(
    {"is_client_error", "is_server_error"}
)
# A single bound (``status >= 500``) is a guess only when compared with
# something named like a status; ``width >= 500`` is not.
STATUS_NAME_MARKERS: tuple[str, ...] = ("status", "code")

# A function-local ``Alias = Name`` is followed when Name is one of these.
ALIASABLE_NAMES: frozenset[str] = (
    BUILTIN_EXCEPTIONS | SEMANTIC_TYPES | frozenset(STATUS_CARRIERS)
)

HTTP_EXCEPTION_MODULES: frozenset[str] = frozenset({"fastapi", "starlette"})
ERRORS_PACKAGE: tuple[str, str] = ("vllm_omni", "errors")

SUGGESTION_BY_STATUS: dict[int, str] = {
    400: "VLLMValidationError",
    404: "VLLMNotFoundError",
    409: "OmniConflictError",
    422: "VLLMUnprocessableEntityError",
    500: "VLLMServerError",
    501: "OmniNotImplementedError",
    503: "OmniServiceUnavailableError",
    504: "OmniStageTimeoutError",
}
GENERIC_SUGGESTION = "a semantic VLLMError subtype"


# -- the migration assistant (``--fix``, ``--suggest``) ----------------------

# Where the rewrites import the semantic types from, and the modules that
# bind the same objects (docs/design.md §2 re-exports them by identity): a file that
# already imports a type from one of them needs no second import.
ERRORS_MODULE = "vllm_omni.errors"
SEMANTIC_SOURCES: frozenset[str] = frozenset(
    {
        ERRORS_MODULE,
        "vllm_omni.errors.types",
        "vllm.exceptions",
        "vllm.v1.engine.exceptions",
    }
)
# What an error model returned by a route is wrapped in (``--fix`` OMNI003),
# and the modules that bind the same callables.
RESPONSE_IMPORTS: dict[str, tuple[str, frozenset[str]]] = {
    "JSONResponse": (
        "fastapi.responses",
        frozenset({"fastapi.responses", "starlette.responses", "fastapi"}),
    ),
    "jsonable_encoder": (
        "fastapi.encoders",
        frozenset({"fastapi.encoders", "fastapi"}),
    ),
}
# A function decorated with ``@<router>.<method>(...)`` in a file importing
# fastapi or starlette is a route: what it returns is the HTTP response.
ROUTE_DECORATORS: frozenset[str] = frozenset(
    {"get", "post", "put", "patch", "delete", "head", "options", "api_route"}
)
WEB_FRAMEWORKS: frozenset[str] = frozenset({"fastapi", "starlette"})
# The semantic types whose constructor takes ``parameter=`` (the field).
PARAMETER_TYPES: frozenset[str] = frozenset(
    {"VLLMValidationError", "VLLMUnprocessableEntityError", "GuardrailViolationError"}
)
# Each semantic type a rewrite may raise, with its parent: which except
# clauses catch it (builtins are looked up in ``builtins``).
SEMANTIC_PARENTS: dict[str, str] = {
    "VLLMError": "Exception",
    "VLLMClientError": "VLLMError",
    "VLLMServerError": "VLLMError",
    "VLLMValidationError": "VLLMClientError",
    "VLLMNotFoundError": "VLLMClientError",
    "VLLMUnprocessableEntityError": "VLLMClientError",
    "GuardrailViolationError": "VLLMClientError",
    "OmniConflictError": "VLLMClientError",
    "OmniClientError": "VLLMClientError",
    "OmniNotImplementedError": "VLLMServerError",
    "OmniServiceUnavailableError": "VLLMServerError",
    "OmniStageTimeoutError": "VLLMServerError",
    "OmniServerError": "VLLMServerError",
}
# The record of docs/design.md §3 and what builds one: ``x.status_code`` of such a
# value has a ``category`` beside it (``--fix`` OMNI004).
RECORD_TYPE = "OmniErrorDetails"
RECORD_BUILDERS: frozenset[str] = frozenset({RECORD_TYPE, "normalize", "from_wire"})
RECORD_CATEGORIES: dict[str, range] = {
    "client": range(400, 500),
    "server": range(500, 600),
}


# A status with no semantic type of its own keeps it on the compat types
# that carry one (docs/design.md §2): the framework handler renders
# ``HTTPException(N, msg)`` as exactly these (its status, ``default_type(N)``).
EXPLICIT_STATUS_TYPES: dict[str, str] = {
    "client": "OmniClientError",
    "server": "OmniServerError",
}
# The one base every type --fix raises instead of an HTTPException shares:
# an except clause that lets HTTPException through lets this through too
# once --fix widens it.
FIX_BASE = "VLLMError"


def semantic_type_for_status(status: int) -> tuple[str, bool] | None:
    """The type ``--fix`` raises instead of ``HTTPException(status)``, and
    whether it needs ``status_code=status``: the table above, else
    ``OmniClientError`` (4xx) or ``OmniServerError`` (5xx) with the status,
    so the client sees the same status and type; None for a status that is
    not an error (1xx-3xx)."""
    known = SUGGESTION_BY_STATUS.get(status)
    if known is not None:
        return known, False
    for category, statuses in RECORD_CATEGORIES.items():
        if status in statuses:
            return EXPLICIT_STATUS_TYPES[category], True
    return None


# fastapi's HTTPException is starlette's, an ``Exception``.
_PARENTS: dict[str, str] = {**SEMANTIC_PARENTS, "HTTPException": "Exception"}


def ancestors(name: str) -> frozenset[str]:
    """The class names an ``except`` clause may name to catch ``name``: a
    builtin exception's MRO, or the chain of a semantic type (or of
    HTTPException) up to Exception."""
    chain: set[str] = set()
    while name in _PARENTS:
        chain.add(name)
        name = _PARENTS[name]
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, BaseException):
        chain.update(cls.__name__ for cls in builtin.__mro__ if cls is not object)
    return frozenset(chain)


def suggest_for_status(status: int | None) -> str:
    """The semantic type for an HTTP status, or the generic advice."""
    if status is None:
        return GENERIC_SUGGESTION
    known = SUGGESTION_BY_STATUS.get(status)
    if known is not None:
        return known
    if status // 100 == 4:
        return f"OmniClientError(status_code={status})"
    return "VLLMServerError"


def suggest_for_raise(name: str, message: str) -> str:
    """The semantic type for a raw raise of ``name`` with ``message``."""
    lowered = message.lower()
    constraint = _VALIDATION_PATTERN.search(lowered) is not None
    for pattern, suggestion, state in _HINT_PATTERNS:
        if not (state and constraint) and pattern.search(lowered) is not None:
            return suggestion
    return RAW_RAISE_SUGGESTIONS[name]


def exception_kind(name: str) -> str:
    """The inventory column ``kind``: raw, semantic, builtin or other."""
    if name in RAW_RAISE_SUGGESTIONS:
        return "raw"
    if name in SEMANTIC_TYPES:
        return "semantic"
    if name in BUILTIN_EXCEPTIONS:
        return "builtin"
    return "other"
