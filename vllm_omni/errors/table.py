"""The status table: exception type → owner, status, public type, param, text.

This is the single source of the mapping in docs/design.md §2. The normalizer reads
it, ``docs/errors/status-mapping.md`` is checked against it by a test, and
the endpoint tests iterate over it. Rows are data, not branches: to change a
status, change a row. Lookup walks the exception's MRO, so the most specific
row wins and subclasses (``LoRAAdapterNotFoundError``,
``ChatTemplateResolutionError``, ``QueueOverflowError``) inherit their
parent's row.

Statuses of Omni types are read from the classes themselves
(``status_code`` / ``error_type`` class data), so a number lives in one place.
A row for an upstream class that only newer vLLM releases define
(``UPSTREAM_SINCE``: ``RetryableRequestError`` 0.32, ``EngineFaultedError``
0.34) is in the table only where the installed vLLM has it; elsewhere its
upstream parent's row stands in.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from http import HTTPStatus
from typing import Literal

# HTTP_STATUS_TYPES is re-exported: the framework handler and the docs test
# read it from here, beside the table.
from vllm_omni.errors.details import HTTP_STATUS_TYPES as HTTP_STATUS_TYPES
from vllm_omni.errors.details import default_type
from vllm_omni.errors.types import (
    ENGINE_FAULTED,
    RETRYABLE_REQUEST,
    EngineDeadError,
    EngineGenerateError,
    GenerationError,
    GracefulHTTPError,
    GuardrailViolationError,
    OmniClientError,
    OmniConflictError,
    OmniEngineDeadError,
    OmniEngineGenerateError,
    OmniNotImplementedError,
    OmniServerError,
    OmniServiceUnavailableError,
    OmniStageTimeoutError,
    VLLMClientError,
    VLLMError,
    VLLMNotFoundError,
    VLLMServerError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
)

Category = Literal["client", "server"]
# How a row's public message is chosen:
#   own      – the exception's own (sanitized) text; it was raised on purpose
#   generic  – GENERIC_SERVER_MESSAGE; the real text goes to the server log
#   fixed    – the class's CLIENT_MESSAGE (EngineDeadError; before vLLM 0.33,
#              which has none, GENERIC_SERVER_MESSAGE, the same sentence)
MessagePolicy = Literal["own", "generic", "fixed"]


@dataclass(frozen=True, slots=True)
class StatusRow:
    """One row of the table: how one exception type is rendered."""

    exc_type: type[BaseException]
    # None: decided by the instance's status (only GracefulHTTPError, whose
    # instances carry an explicit status and no owner).
    category: Category | None
    status_code: int
    error_type: str
    message: MessagePolicy = "own"
    # Instance attributes that override the row's status / type when present.
    status_attr: str | None = None
    type_attr: str | None = None
    # Instance attribute that names the offending request parameter.
    parameter_attr: str | None = None
    fatal: bool = False
    # GracefulHTTPError's public type is the HTTP reason phrase (upstream).
    type_from_phrase: bool = False
    # True for raw-exception rows that exist only in legacy mode.
    legacy_fallback: bool = False
    # A faulted engine's refusal: the record is marked ``faulted``.
    faulted: bool = False
    # Instance attribute with the seconds to wait before a retry.
    retry_after_attr: str | None = None


def _omni(
    exc_type: type[OmniConflictError]
    | type[GuardrailViolationError]
    | type[OmniNotImplementedError]
    | type[OmniServiceUnavailableError]
    | type[OmniStageTimeoutError]
    | type[OmniEngineGenerateError],
    category: Category,
    **extra: object,
) -> StatusRow:
    return StatusRow(
        exc_type,
        category,
        exc_type.status_code,
        exc_type.error_type,
        **extra,  # type: ignore[arg-type]
    )


# vLLM 0.34+: a fault-tolerant engine refuses requests while it recovers. A
# stage that knows its recovery window sets ``retry_after_s`` on the
# exception, which becomes the record's Retry-After (docs/design.md §10).
_FAULTED_ROWS: tuple[StatusRow, ...] = (
    ()
    if ENGINE_FAULTED is None
    else (
        StatusRow(
            ENGINE_FAULTED,
            "server",
            503,
            "ServiceUnavailableError",
            faulted=True,
            retry_after_attr="retry_after_s",
        ),
    )
)

# vLLM 0.32+: RetryableRequestError is a GenerationError whose instances carry
# 503 and whose public type differs from its parent's.
_RETRYABLE_ROWS: tuple[StatusRow, ...] = (
    ()
    if RETRYABLE_REQUEST is None
    else (
        StatusRow(
            RETRYABLE_REQUEST,
            "server",
            503,
            "ServiceUnavailableError",
            status_attr="status_code",
        ),
    )
)

STATUS_TABLE: tuple[StatusRow, ...] = (
    # -- client (upstream) ----------------------------------------------------
    StatusRow(
        VLLMValidationError,
        "client",
        400,
        "BadRequestError",
        parameter_attr="parameter",
    ),
    StatusRow(
        VLLMUnprocessableEntityError,
        "client",
        422,
        "UnprocessableEntityError",
        parameter_attr="parameter",
    ),
    # A not-found request field (``model``) is named, as upstream's 404 does.
    StatusRow(
        VLLMNotFoundError,
        "client",
        404,
        "NotFoundError",
        parameter_attr="parameter",
    ),
    StatusRow(VLLMClientError, "client", 400, "BadRequestError"),
    # -- client (Omni) --------------------------------------------------------
    _omni(GuardrailViolationError, "client", parameter_attr="parameter"),
    _omni(OmniConflictError, "client"),
    StatusRow(
        OmniClientError,
        "client",
        400,
        "BadRequestError",
        status_attr="status_code",
        type_attr="error_type",
    ),
    # -- server (upstream) ----------------------------------------------------
    *_RETRYABLE_ROWS,
    StatusRow(
        GenerationError, "server", 500, "InternalServerError", status_attr="status_code"
    ),
    StatusRow(EngineGenerateError, "server", 500, "InternalServerError"),
    StatusRow(
        EngineDeadError, "server", 500, "InternalServerError", "fixed", fatal=True
    ),
    StatusRow(VLLMServerError, "server", 500, "InternalServerError"),
    *_FAULTED_ROWS,
    # -- server (Omni) --------------------------------------------------------
    _omni(OmniEngineGenerateError, "server"),
    StatusRow(
        OmniEngineDeadError, "server", 500, "InternalServerError", "fixed", fatal=True
    ),
    _omni(OmniNotImplementedError, "server"),
    _omni(OmniServiceUnavailableError, "server"),
    _omni(OmniStageTimeoutError, "server"),
    StatusRow(
        OmniServerError,
        "server",
        500,
        "InternalServerError",
        status_attr="status_code",
        type_attr="error_type",
    ),
    # -- neither: explicit status ---------------------------------------------
    StatusRow(
        GracefulHTTPError,
        None,
        500,
        "InternalServerError",
        status_attr="http_status",
        type_from_phrase=True,
    ),
    StatusRow(VLLMError, "server", 500, "InternalServerError", "generic"),
    # -- everything else ------------------------------------------------------
    StatusRow(Exception, "server", 500, "InternalServerError", "generic"),
    StatusRow(BaseException, "server", 500, "InternalServerError", "generic"),
)

# Raw exceptions upstream still maps to 4xx/501 while call sites migrate. They
# apply only in ``legacy`` mode; in ``strict`` mode they are unknown → 500.
LEGACY_FALLBACKS: tuple[StatusRow, ...] = (
    StatusRow(ValueError, "client", 400, "BadRequestError", legacy_fallback=True),
    StatusRow(TypeError, "client", 400, "BadRequestError", legacy_fallback=True),
    StatusRow(OverflowError, "client", 400, "BadRequestError", legacy_fallback=True),
    StatusRow(
        NotImplementedError,
        "server",
        501,
        "NotImplementedError",
        "generic",
        legacy_fallback=True,
    ),
)

_BY_TYPE: dict[type[BaseException], StatusRow] = {r.exc_type: r for r in STATUS_TABLE}
_LEGACY_BY_TYPE: dict[type[BaseException], StatusRow] = {
    r.exc_type: r for r in LEGACY_FALLBACKS
}


def row_for(exc_type: type[BaseException], legacy: bool = False) -> StatusRow:
    """The most specific row for ``exc_type`` (legacy rows only if asked).

    A class that cannot be looked up (a metaclass that makes it unhashable)
    gets the last-resort row: an unknown server error.
    """
    try:
        return _row_for(exc_type, legacy)
    except TypeError:
        return _BY_TYPE[BaseException]


@cache
def _row_for(exc_type: type[BaseException], legacy: bool) -> StatusRow:
    """``row_for``, cached per (type, mode).

    Legacy rows are for raw exceptions only: a ``VLLMError`` that also inherits
    ``ValueError`` keeps its semantic row, as upstream checks that first.
    """
    legacy = legacy and not issubclass(exc_type, VLLMError)
    for klass in exc_type.__mro__:
        row = _BY_TYPE.get(klass)
        if row is not None and klass not in (Exception, BaseException):
            return row
        if legacy and klass in _LEGACY_BY_TYPE:
            return _LEGACY_BY_TYPE[klass]
        if row is not None:
            return row
    return _BY_TYPE[BaseException]


def phrase_type(status: int) -> str:
    """Upstream's public type for a GracefulHTTPError: the reason phrase."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return default_type(status)
