"""The one normalizer (module ``normalizer``, so the package attribute
``normalize`` stays the function): any exception → ``OmniErrorDetails``, and back.

``normalize`` is the only place that looks at an exception to decide owner,
status, public type, parameter and public text; everything downstream reads
the record. It reads the status table, sanitizes once, and never raises.
``to_exception`` rebuilds the most specific exception from a record, by
``category`` (never by status range), for errors that crossed a process;
``for_caller`` is what the Python APIs raise: always with ``.details``,
always picklable.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pickle
import re
from typing import Any, Literal, NoReturn

from vllm_omni.errors.details import (
    DEFAULT_STATUS,
    GENERIC_SERVER_MESSAGE,
    MAX_RETRY_AFTER_S,
    STATUS_RANGES,
    OmniErrorDetails,
    default_type,
    is_stage_id,
    status_phrase,
)
from vllm_omni.errors.sanitize import (
    sanitize_message,
    sanitize_parameter,
    sanitize_request_id,
)
from vllm_omni.errors.table import (
    StatusRow,
    phrase_type,
    row_for,
)
from vllm_omni.errors.types import (
    ENGINE_FAULTED,
    GRACEFUL_REBUILDS,
    REMOTE_TYPES,
    RETRYABLE_REQUEST,
    UNPICKLABLE_UPSTREAM,
    GenerationError,
    OmniClientError,
    OmniEngineDeadError,
    OmniEngineGenerateError,
    OmniExceptionMixin,
    OmniServerError,
    VLLMError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
)

__all__ = [
    "Mode",
    "fatal_reason",
    "for_caller",
    "from_request_error",
    "logged_by_stage",
    "normalize",
    "raise_for_caller",
    "stage_failure",
    "to_exception",
]

Mode = Literal["strict", "legacy"]

# Upstream's __str__ on these appends ``value=…`` (the rejected value), which
# must never reach a client: their message is read from the first argument.
_VALUE_CARRIERS = (VLLMValidationError, VLLMUnprocessableEntityError)


def _attr(exc: BaseException, name: str | None) -> Any:
    if name is None:
        return None
    try:
        return getattr(exc, name, None)
    except Exception:
        return None


def _without_value(exc: BaseException, text: str) -> str:
    """``text`` with the exception's own rejected ``value`` cut out: upstream
    writes it into the message too (``temperature must be non-negative, got
    -1.0.``), and a client must never get its rejected value back."""
    value = _attr(exc, "value") if isinstance(exc, _VALUE_CARRIERS) else None
    if value is None or isinstance(value, bool):
        return text
    forms = tuple({v: None for v in (str(value), repr(value)) if v and v in text})
    if not forms:
        return text  # not in the message: nothing to cut
    if sum(map(len, forms)) > _REMEMBERED_FORM_LEN:
        return _value_pattern.__wrapped__(forms).sub("the rejected value", text)
    return _value_pattern(forms).sub("the rejected value", text)


# Rejected values written longer than this are not remembered (a long
# string a client sent): their pattern is built for the one message.
_REMEMBERED_FORM_LEN = 64


@functools.lru_cache(maxsize=256)
def _value_pattern(forms: tuple[str, ...]) -> re.Pattern[str]:
    """The written forms of a rejected value, as a whole word: the longest
    first (``'abc'`` before ``abc``). Remembered: a server sees the same few
    rejected values again and again (a prompt's length, a limit). Each form
    is matched first and its start checked after (a lookbehind as long as
    the form and one more character): a pattern that opens with a literal
    is searched for as one, several times faster than one that opens with
    a lookbehind tried at every position."""
    alternatives = "|".join(
        f"{v}(?<![\\w.-]{v})"
        for v in (re.escape(form) for form in sorted(forms, key=len, reverse=True))
    )
    return re.compile(rf"(?:{alternatives})(?![\w])")


def _own_text(exc: BaseException) -> str:
    message = _attr(exc, "message")
    if isinstance(message, str):
        return _without_value(exc, message)
    args = _attr(exc, "args") or ()
    if isinstance(args, tuple) and args and isinstance(args[0], str):
        return _without_value(exc, args[0])
    if isinstance(exc, _VALUE_CARRIERS):
        return ""
    try:
        return str(exc)
    except Exception:
        return ""


def _stage_of(exc: BaseException, fallback: int | None) -> int | None:
    for candidate in (_attr(exc, "stage_id"), fallback):
        if is_stage_id(candidate):
            return candidate  # type: ignore[no-any-return]
    return None


def _retry_after(exc: BaseException, row: StatusRow) -> int | None:
    """The row's retry delay from the instance, in whole seconds (rounded
    up, capped at ``MAX_RETRY_AFTER_S``); None when it has none."""
    value = _attr(exc, row.retry_after_attr)
    # ``not value > 0`` also refuses NaN.
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return None
    return MAX_RETRY_AFTER_S if value >= MAX_RETRY_AFTER_S else math.ceil(value)


def _from_row(
    exc: BaseException,
    row: StatusRow,
    request_id: str | None,
    stage_id: int | None,
) -> OmniErrorDetails:
    status = row.status_code
    declared = _attr(exc, row.status_attr)
    if isinstance(declared, int) and not isinstance(declared, bool):
        status = int(declared)
    category = row.category or (
        "client" if status in STATUS_RANGES["client"] else "server"
    )
    if status not in STATUS_RANGES[category]:
        status = DEFAULT_STATUS[category]

    error_type = row.error_type
    if row.type_from_phrase:
        error_type = phrase_type(status)
    declared_type = _attr(exc, row.type_attr)
    if isinstance(declared_type, str) and declared_type:
        error_type = declared_type

    if row.message == "generic":
        message = GENERIC_SERVER_MESSAGE
    elif row.message == "fixed":
        fixed = _attr(exc, "CLIENT_MESSAGE")
        message = fixed if isinstance(fixed, str) else GENERIC_SERVER_MESSAGE
    else:
        message = sanitize_message(_own_text(exc))
        if not message.strip():
            message = status_phrase(status)

    record = dict(
        message=message,
        category=category,
        status_code=status,
        error_type=error_type,
        parameter=sanitize_parameter(_attr(exc, row.parameter_attr)),
        request_id=request_id,
        stage_id=_stage_of(exc, stage_id),
        fatal=row.fatal,
        faulted=row.faulted and status == 503,
        retry_after_s=_retry_after(exc, row),
    )
    try:
        return OmniErrorDetails(**record)  # type: ignore[arg-type]
    except RuntimeError:
        # Only a class-declared error_type can fail here (a free-form string on
        # a compat type): keep everything else and use the default type.
        record["error_type"] = default_type(status, category)
        return OmniErrorDetails(**record)  # type: ignore[arg-type]


def normalize(
    exc: BaseException,
    *,
    request_id: str | None = None,
    stage_id: int | None = None,
    mode: Mode = "strict",
) -> OmniErrorDetails:
    """Classify ``exc`` into a sanitized record. Never raises.

    An exception's own ``.details`` record is used verbatim (only a missing
    request or stage id is filled in). ``mode="legacy"`` enables the raw
    ``ValueError``/``TypeError``/``OverflowError`` → 400 and
    ``NotImplementedError`` → 501 fallbacks; in ``strict`` mode they are
    unknown server errors.
    """
    request_id = sanitize_request_id(request_id)
    try:
        own = _attr(exc, "details")
        if isinstance(own, OmniErrorDetails):
            fill: dict[str, Any] = {}
            if own.request_id is None and request_id is not None:
                fill["request_id"] = request_id
            stage = _stage_of(exc, stage_id)
            if own.stage_id is None and stage is not None:
                fill["stage_id"] = stage
            return dataclasses.replace(own, **fill) if fill else own
        row = row_for(type(exc), mode == "legacy")
        return _from_row(exc, row, request_id, stage_id)
    except Exception:
        return OmniErrorDetails(
            GENERIC_SERVER_MESSAGE,
            "server",
            500,
            "InternalServerError",
            request_id=request_id,
            stage_id=stage_id if is_stage_id(stage_id) else None,
        )


def is_legacy_fallback(exc: BaseException) -> bool:
    """True when ``exc`` is rendered by a raw-exception fallback row in legacy mode."""
    if isinstance(exc, VLLMError):
        return False
    return row_for(type(exc), True).legacy_fallback


def to_exception(details: OmniErrorDetails, *, reason: str | None = None) -> VLLMError:
    """Rebuild the most specific known exception from a record (docs/design.md §3).

    Ownership comes from ``category``, never from a status range. A record
    whose (category, status, type) names a semantic class is rebuilt as its
    ``Remote*`` class (the semantic class and the 0.30 wrapper at once); a
    ``faulted`` record as ``RemoteEngineFaultedError`` where vLLM defines
    ``EngineFaultedError`` (else by its shape, a 503); a fatal record as
    ``OmniEngineDeadError`` (``reason`` is its log text); a stage's internal
    500 as ``OmniEngineGenerateError``; anything else as the wrapper
    ``OmniClientError`` / ``OmniServerError``. Each carries ``.details``
    equal to the record.
    """
    if details.fatal:
        return OmniEngineDeadError(
            stage_id=details.stage_id, reason=reason, details=details
        )
    if details.faulted and ENGINE_FAULTED is not None:
        return GRACEFUL_REBUILDS[ENGINE_FAULTED](details)
    remote = REMOTE_TYPES.get(
        (details.category, details.status_code, details.error_type)
    )
    if remote is not None:
        return remote(details)  # type: ignore[call-arg]
    if details.category == "client":
        return OmniClientError(
            details.message,
            status_code=details.status_code,
            error_type=details.error_type,
            details=details,
        )
    if details.stage_id is not None and details.error_type == "InternalServerError":
        return OmniEngineGenerateError(
            details.message, stage_id=details.stage_id, details=details
        )
    return OmniServerError(
        details.message,
        status_code=details.status_code,
        error_type=details.error_type,
        details=details,
    )


_LOGGED_BY_STAGE = "_vllm_omni_logged_by_stage"


def stage_failure(details: OmniErrorDetails) -> VLLMError:
    """``to_exception(details)`` for a stage's failure record, marked as
    logged by that stage: the stage logged the original (its text and
    traceback) when it failed (``log_failure``), so the server logs this
    rebuild without a traceback of its own, which would show only the
    plumbing it travelled through (``logged_by_stage``)."""
    exc = to_exception(details)
    setattr(exc, _LOGGED_BY_STAGE, details.stage_id)
    return exc


def logged_by_stage(exc: BaseException | None) -> int | None:
    """The stage whose log line has ``exc``'s cause (``stage_failure``), or
    ``None`` when ``exc`` was not rebuilt from a stage's record."""
    stage_id = getattr(exc, _LOGGED_BY_STAGE, None) if exc is not None else None
    return stage_id if isinstance(stage_id, int) else None


# The module of this package's exception classes: every one of them pickles
# with its arguments and record (tests/errors/test_python_callers.py), so a
# failed request's rebuilt exception is not round-tripped to find out.
_OWN_TYPES_MODULE = OmniExceptionMixin.__module__


def _survives_pickle(exc: BaseException) -> bool:
    if type(exc).__module__ == _OWN_TYPES_MODULE:
        return True
    if isinstance(exc, UNPICKLABLE_UPSTREAM) and not isinstance(
        exc, OmniExceptionMixin
    ):
        return False
    try:
        copy = pickle.loads(pickle.dumps(exc))
    except Exception:
        return False
    return type(copy) is type(exc) and copy.args == exc.args


def for_caller(exc: Exception, *, request_id: str | None = None) -> VLLMError:
    """What a Python API raises for ``exc``: always a ``VLLMError`` with ``.details``.

    The Python APIs are a transport like HTTP: ``.details`` is the record the
    server would render (with the request id). A semantic exception that
    survives ``pickle`` is handed on itself, with ``.details`` set; upstream's
    admission refusals (``QueueOverflowError``, ``MaxQueuedTokensError``,
    0.34's ``EngineFaultedError``) are rebuilt as their own class that
    pickles (``GRACEFUL_REBUILDS``); anything else (an upstream type that
    cannot round-trip, an unknown exception) is replaced by the record
    rebuilt with ``to_exception``; raise it ``from`` the original, which
    keeps the traceback in this process.
    """
    details = normalize(exc, request_id=request_id)
    if isinstance(exc, VLLMError) and _survives_pickle(exc):
        try:
            exc.details = details  # type: ignore[attr-defined]
        except Exception:
            return to_exception(details, reason=_attr(exc, "reason"))
        return exc
    rebuild = GRACEFUL_REBUILDS.get(type(exc))  # type: ignore[arg-type]
    if rebuild is not None:
        return rebuild(details)
    reason = _attr(exc, "reason")
    return to_exception(details, reason=reason if isinstance(reason, str) else None)


def raise_for_caller(exc: Exception, *, request_id: str | None = None) -> NoReturn:
    """Raise ``for_caller(exc)``: ``exc`` itself, or its rebuild ``from`` it."""
    error = for_caller(exc, request_id=request_id)
    if error is exc:
        raise exc
    raise error from exc


def fatal_reason(exc: BaseException) -> str:
    """The sanitized log text of a fatal error, to travel beside its record."""
    reason = _attr(exc, "reason")
    text = reason if isinstance(reason, str) else ""
    return sanitize_message(text).strip() or type(exc).__name__


def from_request_error(
    error: Any, *, request_id: str | None = None, stage_id: int | None = None
) -> OmniErrorDetails:
    """Record for upstream ``vllm.outputs.RequestError`` (a per-request failure).

    vLLM 0.33+ says which exception it stands for (``to_exception()``).
    0.32's has no such method; its servers raise ``RetryableRequestError`` for
    a retryable one, else ``GenerationError``, and so does this. Before 0.32
    there is no ``RequestError``.
    """
    malformed = RuntimeError("malformed RequestError")
    try:
        to_exception = getattr(error, "to_exception", None)
        if to_exception is not None:
            exc = to_exception()
        else:
            message, retryable = error.message, error.retryable
            if not isinstance(message, str) or not isinstance(retryable, bool):
                exc = malformed
            elif retryable and RETRYABLE_REQUEST is not None:
                exc = RETRYABLE_REQUEST(message)
            else:
                exc = GenerationError(message)
    except Exception:
        exc = malformed
    if exc is malformed:
        return normalize(malformed, request_id=request_id)
    return normalize(exc, request_id=request_id, stage_id=stage_id)
