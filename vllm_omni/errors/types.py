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

Each Omni type carries its status and public type as class data
(``status_code``, ``error_type``); the status table in ``table.py`` reads them,
so the numbers live in exactly one place. This module owns the classes only:
it does not map, sanitize or render.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from vllm.exceptions import (
    GenerationError,
    GracefulHTTPError,
    VLLMClientError,
    VLLMError,
    VLLMNotFoundError,
    VLLMServerError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
)
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from vllm_omni.errors.details import STATUS_RANGES

if TYPE_CHECKING:
    from vllm_omni.errors.details import OmniErrorDetails

__all__ = [
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
    "VLLMClientError",
    "VLLMError",
    "VLLMNotFoundError",
    "VLLMServerError",
    "VLLMUnprocessableEntityError",
    "VLLMValidationError",
]


class _StatusOnClass:
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

    Clients see ``EngineDeadError.CLIENT_MESSAGE``; ``str()`` stays the
    log-oriented upstream text, extended by the stage that died.
    """

    status_code = 500
    error_type = "InternalServerError"

    def __init__(
        self,
        *,
        stage_id: int | None = None,
        reason: str | None = None,
        details: OmniErrorDetails | None = None,
        suppress_context: bool = False,
    ) -> None:
        super().__init__(suppress_context=suppress_context)
        self.stage_id = stage_id
        self.reason = reason
        self.details = details

    def __str__(self) -> str:
        where = "" if self.stage_id is None else f" Stage {self.stage_id} died"
        why = "" if not self.reason else f" ({self.reason})"
        return f"{self.ENGINE_DEAD_MESSAGE}{where}{why}".rstrip()


# -- compatibility and remote wrappers ---------------------------------------


class _ExplicitStatus:
    """Mixin: an error whose status and public type are given per instance."""

    _statuses: ClassVar[range]

    def _set_status(
        self,
        message: str,
        status_code: int,
        error_type: str,
        details: OmniErrorDetails | None,
    ) -> None:
        self.message = message
        self.status_code = int(status_code)
        self.error_type = error_type
        self.details = details
        if self.status_code not in self._statuses:
            family = f"{self._statuses.start // 100}xx"
            raise RuntimeError(
                f"{type(self).__name__} needs a {family} status, got {self.status_code}"
            )


class OmniClientError(_ExplicitStatus, VLLMClientError):
    """A client error with an explicit 4xx status: compat type and remote wrapper.

    Kept with its 0.30 constructor. It is no longer a ``ValueError``: catch
    ``VLLMClientError`` (or a specific subtype) instead.
    """

    _statuses = STATUS_RANGES["client"]

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 400,
        error_type: str = "BadRequestError",
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
        error_type: str = "InternalServerError",
        details: OmniErrorDetails | None = None,
    ) -> None:
        super().__init__(message)
        self._set_status(message, status_code, error_type, details)
