"""Semantic exception types: upstream vLLM's, re-exported by identity, plus Omni's.

The tree (status and public ``error.type`` in brackets)::

    VLLMError                                   (vllm.exceptions)
    ├── VLLMClientError                         [400 BadRequestError]
    │   ├── VLLMValidationError                 [400 BadRequestError, param]
    │   ├── VLLMNotFoundError                   [404 NotFoundError]
    │   ├── VLLMUnprocessableEntityError        [422 UnprocessableEntityError, param]
    │   ├── GuardrailViolationError             [400 GuardrailViolationError]  Omni
    │   ├── OmniConflictError                   [409 ConflictError]            Omni
    │   └── OmniClientError                     [given 4xx]   compat + remote  Omni
    ├── VLLMServerError                         [500 InternalServerError]
    │   ├── GenerationError                     [its own status]
    │   ├── EngineGenerateError                 [500]   (vllm.v1.engine.exceptions)
    │   │   └── OmniEngineGenerateError         [500, stage_id]                Omni
    │   ├── EngineDeadError                     [500, fatal]
    │   │   └── OmniEngineDeadError             [500, fatal, stage_id]         Omni
    │   ├── OmniNotImplementedError             [501 NotImplementedError]      Omni
    │   ├── OmniServiceUnavailableError         [503 ServiceUnavailableError]  Omni
    │   ├── OmniStageTimeoutError               [504 GatewayTimeoutError]      Omni
    │   └── OmniServerError                     [given 5xx]   remote wrapper   Omni
    └── GracefulHTTPError                       [its own status]
        └── EngineFaultedError                  [503 ServiceUnavailableError] 0.34+

The package runs on every vLLM from 0.30 (the first with the
``VLLMClientError``/``VLLMServerError`` split) to 0.34. Upstream classes that
only newer releases define are listed in ``UPSTREAM_SINCE``: where the
installed vLLM lacks one, its name is absent here, from the table and from
``vllm_omni.errors``, and what stands in is upstream's own parent, by
identity (docs/errors/status-mapping.md, "Older vLLM releases"):
``EngineFaultedError`` (0.34) and ``RetryableRequestError`` (0.32) are the
ones with rows. ``EngineDeadError``'s two texts became class attributes in
0.33; ``ENGINE_DEAD_MESSAGE`` and ``ENGINE_DEAD_CLIENT_MESSAGE`` here are
upstream's where it has them.

Each Omni type carries its status and public type as class data
(``status_code``, ``error_type``); the status table in ``table.py`` reads them,
so the numbers live in exactly one place.

Errors that crossed a process are rebuilt (``to_exception``) as the most
specific semantic class the record names. For one release each of those is
also the wrapper it used to be, through a ``Remote*`` class that inherits
both: ``RemoteVLLMNotFoundError`` is a ``VLLMNotFoundError`` *and* an
``OmniClientError``.

Every Omni type survives ``pickle`` (any protocol), ``copy`` and
``deepcopy`` with its message, attributes and ``.details``: it pickles as
"its class, its ``args``, its ``__dict__``" and is restored without calling
``__init__``, so keyword-only constructors (upstream's ``EngineDeadError``
pattern) cannot break a process pool. Upstream types that cannot round-trip
are listed in ``UNPICKLABLE_UPSTREAM``; the APIs never hand them to callers.

0.30 names kept for one release (docs/errors/stages.md), deprecated: every
Omni type answers ``error_stage_id`` (its ``stage_id``), and
``OmniEngineDeadError`` takes 0.30's ``(message, error_stage_id=)``.

This module owns the classes only: it does not map, sanitize or render.
"""

from __future__ import annotations

import warnings
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, ClassVar

import vllm.exceptions
from vllm.exceptions import (
    GenerationError,
    GracefulHTTPError,
    MaxQueuedTokensError,
    QueueOverflowError,
    VLLMClientError,
    VLLMError,
    VLLMNotFoundError,
    VLLMServerError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
)

from vllm_omni.errors.details import (
    GENERIC_SERVER_MESSAGE,
    STATUS_RANGES,
    default_type,
)
from vllm_omni.upstream import engine_exceptions

if TYPE_CHECKING:
    from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

    from vllm_omni.errors.details import OmniErrorDetails
else:
    # Upstream's classes, without the cost of their package (vllm_omni.upstream).
    EngineDeadError = engine_exceptions().EngineDeadError
    EngineGenerateError = engine_exceptions().EngineGenerateError

__all__ = [
    "ENGINE_DEAD_CLIENT_MESSAGE",
    "ENGINE_DEAD_MESSAGE",
    "ENGINE_FAULTED",
    "GRACEFUL_REBUILDS",
    "REMOTE_TYPES",
    "RETRYABLE_REQUEST",
    "UNPICKLABLE_UPSTREAM",
    "UPSTREAM_SINCE",
    "EngineDeadError",
    "EngineGenerateError",
    "GenerationError",
    "GracefulHTTPError",
    "GuardrailViolationError",
    "OmniClientError",
    "OmniConflictError",
    "OmniEngineDeadError",
    "OmniEngineGenerateError",
    "OmniNotImplementedError",
    "OmniServerError",
    "OmniServiceUnavailableError",
    "OmniStageTimeoutError",
    "RemoteGuardrailViolationError",
    "RemoteMaxQueuedTokensError",
    "RemoteOmniConflictError",
    "RemoteOmniNotImplementedError",
    "RemoteOmniServiceUnavailableError",
    "RemoteOmniStageTimeoutError",
    "RemoteQueueOverflowError",
    "RemoteVLLMNotFoundError",
    "RemoteVLLMUnprocessableEntityError",
    "RemoteVLLMValidationError",
    "VLLMClientError",
    "VLLMError",
    "VLLMNotFoundError",
    "VLLMServerError",
    "VLLMUnprocessableEntityError",
    "VLLMValidationError",
]


# Upstream classes this project maps or documents that not every supported
# vLLM (0.30 to 0.34) defines in ``vllm.exceptions``, and the release that
# added each; docs/errors/status-mapping.md marks their rows "vLLM X+".
UPSTREAM_SINCE: dict[str, str] = {
    "RetryableRequestError": "0.32",
    "ProfilerAlreadyActiveError": "0.32",
    "ChatTemplateResolutionError": "0.33",
    "EngineFaultedError": "0.34",
}


def upstream_class(name: str) -> type[VLLMError] | None:
    """``vllm.exceptions.<name>`` by identity, or None where the installed
    vLLM predates it (only for the names of ``UPSTREAM_SINCE``)."""
    if name not in UPSTREAM_SINCE:
        raise KeyError(f"{name} is in every supported vLLM; import it directly")
    found = getattr(vllm.exceptions, name, None)
    return found if isinstance(found, type) and issubclass(found, VLLMError) else None


# vLLM 0.32+: a transient request failure (a ``GenerationError`` whose
# instances carry 503). Before 0.32 its row is absent and nothing raises it;
# its parent's row (``GenerationError``, status from the instance) stands in.
RETRYABLE_REQUEST: type[GenerationError] | None = upstream_class(  # type: ignore[assignment]
    "RetryableRequestError"
)

# ``EngineDeadError``'s log text (``str()``) and the text clients get. vLLM
# 0.33 made both class attributes; before, the log text was only the
# instance's message (read from an instance: upstream's own text, never
# copied) and upstream sent clients that log text. Where upstream has no
# ``CLIENT_MESSAGE`` the client text is ``GENERIC_SERVER_MESSAGE``, the
# sentence 0.33 chose, so no vLLM shows clients the log text.
ENGINE_DEAD_MESSAGE: str = getattr(EngineDeadError, "ENGINE_DEAD_MESSAGE", None) or str(
    EngineDeadError()
)
ENGINE_DEAD_CLIENT_MESSAGE: str = getattr(
    EngineDeadError, "CLIENT_MESSAGE", GENERIC_SERVER_MESSAGE
)


def _deprecated(what: str, instead: str) -> None:
    """One DeprecationWarning for a 0.30 form, at the caller's line."""
    warnings.warn(
        f"{what} is deprecated and will be removed in the next release; {instead}.",
        DeprecationWarning,
        stacklevel=3,
    )


def _restore(
    cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]
) -> BaseException:
    """Unpickle an Omni exception: no ``__init__``, so any signature survives."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class OmniExceptionMixin:
    """Mixin for every Omni type: pickles whole, shows its status in ``repr``.

    ``details`` is the record the server would render for this exception;
    the APIs set it on everything they raise (``None`` on a bare instance).
    """

    details: OmniErrorDetails | None = None
    args: tuple[Any, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException's own reduce calls ``cls(*args)``, which fails for
        # keyword-only constructors and doubles EngineDeadError's args.
        return (_restore, (type(self), self.args, dict(vars(self))))

    @property
    def error_stage_id(self) -> int | None:
        """Deprecated 0.30 name of ``stage_id`` (the record's, when the
        instance has none of its own); warns on every read."""
        _deprecated("error_stage_id", "read stage_id or .details.stage_id")
        stage = getattr(self, "stage_id", None)
        if stage is None and self.details is not None:
            stage = self.details.stage_id
        return stage

    def __repr__(self) -> str:
        details = self.details
        status = getattr(self, "status_code", None)
        error_type = getattr(self, "error_type", None)
        stage = getattr(self, "stage_id", None)
        if details is not None:
            status, error_type = details.status_code, details.error_type
            stage = details.stage_id if details.stage_id is not None else stage
        try:
            text = str(self)
        except Exception:
            text = "<unprintable>"
        return (
            f"{type(self).__name__}({text!r}, status_code={status!r}, "
            f"error_type={error_type!r}, stage_id={stage!r})"
        )


class _StatusOnClass(OmniExceptionMixin):
    """Mixin: an Omni type whose status and public type are fixed class data."""

    status_code: ClassVar[int]
    error_type: ClassVar[str]


# -- client errors -----------------------------------------------------------


class GuardrailViolationError(_StatusOnClass, VLLMClientError):
    """A guardrail rejected the request content (400)."""

    status_code = 400
    error_type = "GuardrailViolationError"

    def __init__(self, message: str, *, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


class OmniConflictError(_StatusOnClass, VLLMClientError):
    """A resource, such as an async job, is in a state the operation needs not (409)."""

    status_code = 409
    error_type = "ConflictError"


# -- server errors -----------------------------------------------------------


class OmniNotImplementedError(_StatusOnClass, VLLMServerError):
    """The invoked server operation is declared but not implemented (501)."""

    status_code = 501
    error_type = "NotImplementedError"


class OmniServiceUnavailableError(_StatusOnClass, VLLMServerError):
    """A required handler, pipeline or stage is unavailable (503)."""

    status_code = 503
    error_type = "ServiceUnavailableError"

    def __init__(self, message: str, *, stage_id: int | None = None) -> None:
        super().__init__(message)
        self.stage_id = stage_id


class OmniStageTimeoutError(_StatusOnClass, VLLMServerError):
    """A stage or generation deadline expired (504)."""

    status_code = 504
    error_type = "GatewayTimeoutError"

    def __init__(self, message: str, *, stage_id: int | None = None) -> None:
        super().__init__(message)
        self.stage_id = stage_id


class OmniEngineGenerateError(_StatusOnClass, EngineGenerateError):
    """A nonfatal stage failure that failed one request (500, with ``stage_id``)."""

    status_code = 500
    error_type = "InternalServerError"

    def __init__(
        self,
        message: str = "Stage failed to process the request.",
        *,
        stage_id: int | None = None,
        details: OmniErrorDetails | None = None,
    ) -> None:
        super().__init__(message)
        self.stage_id = stage_id
        self.details = details


class OmniEngineDeadError(_StatusOnClass, EngineDeadError):
    """A stage died; the engine is unrecoverable (500, fatal, with ``stage_id``).

    Clients see ``CLIENT_MESSAGE`` (upstream's ``EngineDeadError``'s on vLLM
    0.33+); ``str()`` stays the log-oriented upstream text, extended by the
    stage that died.

    The 0.30 form ``OmniEngineDeadError(message, error_stage_id=N)`` still
    works for one release, deprecated (one warning per call): its message
    was the log text of the death, so it becomes ``reason``.
    """

    status_code = 500
    error_type = "InternalServerError"
    # Upstream's (0.33+), or their stand-ins on an older vLLM (see above).
    ENGINE_DEAD_MESSAGE: ClassVar[str] = ENGINE_DEAD_MESSAGE
    CLIENT_MESSAGE: ClassVar[str] = ENGINE_DEAD_CLIENT_MESSAGE

    def __init__(
        self,
        message: str | None = None,
        *,
        stage_id: int | None = None,
        reason: str | None = None,
        details: OmniErrorDetails | None = None,
        suppress_context: bool = False,
        error_stage_id: int | None = None,
    ) -> None:
        if message is not None or error_stage_id is not None:
            if (message is not None and reason is not None) or (
                error_stage_id is not None and stage_id is not None
            ):
                raise RuntimeError(
                    "OmniEngineDeadError: pass reason= and stage_id= only, "
                    "not also their 0.30 forms"
                )
            _deprecated(
                "OmniEngineDeadError(message, error_stage_id=)",
                "pass reason= and stage_id=",
            )
            reason = reason if message is None else message
            stage_id = stage_id if error_stage_id is None else error_stage_id
        super().__init__(suppress_context=suppress_context)
        self.stage_id = stage_id
        self.reason = reason
        self.details = details

    def __str__(self) -> str:
        where = "" if self.stage_id is None else f" Stage {self.stage_id} died"
        why = "" if not self.reason else f" ({self.reason})"
        return f"{self.ENGINE_DEAD_MESSAGE}{where}{why}".rstrip()


# -- compatibility and remote wrappers ---------------------------------------


class _ExplicitStatus(OmniExceptionMixin):
    """Mixin: an error whose status and public type are given per instance."""

    _statuses: ClassVar[range]

    def _set_status(
        self,
        message: str,
        status_code: int,
        error_type: str | None,
        details: OmniErrorDetails | None,
    ) -> None:
        self.message = message
        self.status_code = int(status_code)
        self.error_type = error_type or default_type(self.status_code)
        self.details = details
        if self.status_code not in self._statuses:
            family = f"{self._statuses.start // 100}xx"
            raise RuntimeError(
                f"{type(self).__name__} needs a {family} status, got {self.status_code}"
            )


class OmniClientError(_ExplicitStatus, VLLMClientError):
    """A client error with an explicit 4xx status: compat type and remote wrapper.

    Kept with its 0.30 constructor; ``error_type`` defaults to the status's
    type (404 ``NotFoundError``, 409 ``ConflictError``, ...). It is no longer
    a ``ValueError``: catch ``VLLMClientError`` (or a specific subtype).
    """

    _statuses = STATUS_RANGES["client"]

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 400,
        error_type: str | None = None,
        details: OmniErrorDetails | None = None,
    ) -> None:
        super().__init__(message)
        self._set_status(message, status_code, error_type, details)


class OmniServerError(_ExplicitStatus, VLLMServerError):
    """A server error with an explicit 5xx status, rebuilt from the wire."""

    _statuses = STATUS_RANGES["server"]

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 500,
        error_type: str | None = None,
        details: OmniErrorDetails | None = None,
    ) -> None:
        super().__init__(message)
        self._set_status(message, status_code, error_type, details)


# -- remote rebuilds ---------------------------------------------------------


class _Remote:
    """Mixin: a semantic type rebuilt from a record that crossed a process.

    Built only by ``to_exception``; ``__init__`` takes the record, so the
    semantic parent's constructor (which wants the original arguments) is
    never called. ``.details`` is the record, verbatim.
    """

    parameter: str | None = None
    value: None = None  # upstream's __str__ reads it; the rejected value never travels
    stage_id: int | None = None

    def __init__(self, details: OmniErrorDetails) -> None:
        Exception.__init__(self, details.message)  # type: ignore[arg-type]
        self._set_status(  # type: ignore[attr-defined]
            details.message, details.status_code, details.error_type, details
        )
        self.parameter = details.parameter
        self.stage_id = details.stage_id


class RemoteVLLMValidationError(_Remote, VLLMValidationError, OmniClientError):
    """A stage's 400: a ``VLLMValidationError`` and an ``OmniClientError``."""


class RemoteVLLMNotFoundError(_Remote, VLLMNotFoundError, OmniClientError):
    """A stage's 404: a ``VLLMNotFoundError`` and an ``OmniClientError``."""


class RemoteVLLMUnprocessableEntityError(
    _Remote, VLLMUnprocessableEntityError, OmniClientError
):
    """A stage's 422: a ``VLLMUnprocessableEntityError`` and an ``OmniClientError``."""


class RemoteGuardrailViolationError(_Remote, GuardrailViolationError, OmniClientError):
    """A guardrail's 400: a ``GuardrailViolationError`` and an ``OmniClientError``."""


class RemoteOmniConflictError(_Remote, OmniConflictError, OmniClientError):
    """A stage's 409: an ``OmniConflictError`` and an ``OmniClientError``."""


class RemoteOmniNotImplementedError(_Remote, OmniNotImplementedError, OmniServerError):
    """A stage's 501: an ``OmniNotImplementedError`` and an ``OmniServerError``."""


class RemoteOmniServiceUnavailableError(
    _Remote, OmniServiceUnavailableError, OmniServerError
):
    """A stage's 503: an ``OmniServiceUnavailableError`` and an ``OmniServerError``."""


class RemoteOmniStageTimeoutError(_Remote, OmniStageTimeoutError, OmniServerError):
    """A stage's own 504: an ``OmniStageTimeoutError`` and an ``OmniServerError``."""


class _RemoteGraceful(_Remote):
    """Mixin: an upstream ``GracefulHTTPError`` rebuilt so that it pickles.

    Sets the attributes upstream's class has (``message``, ``http_status``),
    so code written against upstream reads them as before.
    """

    def __init__(self, details: OmniErrorDetails) -> None:
        super().__init__(details)
        self.message = details.message
        self.http_status = HTTPStatus(details.status_code)


class RemoteQueueOverflowError(
    _RemoteGraceful, QueueOverflowError, OmniServiceUnavailableError, OmniServerError
):
    """Admission's 503: upstream's ``QueueOverflowError``, an
    ``OmniServiceUnavailableError`` and an ``OmniServerError``, that pickles."""


class RemoteMaxQueuedTokensError(
    _RemoteGraceful,
    MaxQueuedTokensError,
    OmniServiceUnavailableError,
    OmniServerError,
):
    """The prefill backlog's 503: upstream's ``MaxQueuedTokensError``, an
    ``OmniServiceUnavailableError`` and an ``OmniServerError``, that pickles."""


# vLLM 0.34's refusal while a fault-tolerant engine recovers (a 503
# ``GracefulHTTPError`` without arguments); None where vLLM does not define it.
ENGINE_FAULTED: type[GracefulHTTPError] | None = upstream_class(  # type: ignore[assignment]
    "EngineFaultedError"
)
_REBUILDS: dict[type[GracefulHTTPError], type[_RemoteGraceful]] = {}

if ENGINE_FAULTED is not None:
    EngineFaultedError = ENGINE_FAULTED

    class RemoteEngineFaultedError(  # type: ignore[valid-type,misc]
        _RemoteGraceful,
        EngineFaultedError,
        OmniServiceUnavailableError,
        OmniServerError,
    ):
        """A faulted engine's 503: upstream's ``EngineFaultedError``, an
        ``OmniServiceUnavailableError`` and an ``OmniServerError``, that
        pickles; rebuilt from any record marked ``faulted``."""

    _REBUILDS[EngineFaultedError] = RemoteEngineFaultedError
    __all__ += ["EngineFaultedError", "RemoteEngineFaultedError"]


# Upstream's admission refusals do not pickle, and their records cannot be
# told apart (both a 503 "Service Unavailable"); the APIs see the original in
# their own process and hand callers this rebuild of the same class, so
# ``except QueueOverflowError`` works for a Python caller as it does on
# ``AsyncLLM``.
GRACEFUL_REBUILDS: dict[type[GracefulHTTPError], type[_RemoteGraceful]] = {
    QueueOverflowError: RemoteQueueOverflowError,
    MaxQueuedTokensError: RemoteMaxQueuedTokensError,
    **_REBUILDS,
}

# Which class ``to_exception`` rebuilds, by the record's (category, status,
# public type): the semantic parent's row of the status table, checked
# against this list by a test. Records of other shapes get the wrappers.
REMOTE_TYPES: dict[tuple[str, int, str], type[VLLMError]] = {
    ("client", 400, "BadRequestError"): RemoteVLLMValidationError,
    ("client", 404, "NotFoundError"): RemoteVLLMNotFoundError,
    ("client", 422, "UnprocessableEntityError"): RemoteVLLMUnprocessableEntityError,
    ("client", 400, "GuardrailViolationError"): RemoteGuardrailViolationError,
    ("client", 409, "ConflictError"): RemoteOmniConflictError,
    ("server", 501, "NotImplementedError"): RemoteOmniNotImplementedError,
    ("server", 503, "ServiceUnavailableError"): RemoteOmniServiceUnavailableError,
    ("server", 504, "GatewayTimeoutError"): RemoteOmniStageTimeoutError,
}

# Upstream types whose instances do not survive a pickle round trip (their
# constructors do not accept their own ``args``; ``EngineDeadError`` doubles
# them). The APIs hand callers the record rebuilt by ``to_exception`` instead,
# with the original as ``__cause__``. A test fails when upstream fixes one.
UNPICKLABLE_UPSTREAM: tuple[type[BaseException], ...] = (
    EngineDeadError,
    GracefulHTTPError,
)
