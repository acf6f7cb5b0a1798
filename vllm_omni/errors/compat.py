"""Deprecated 0.30 names that shipped beside ``OmniClientError``.

They stay importable for one release (docs/errors/stages.md, compatibility
window). The helpers warn on every call; each one guessed ownership from a
status number; new code passes ``OmniErrorDetails`` and lets
``to_exception`` decide by ``category``. The constant
``DEFAULT_CLIENT_ERROR_TYPE`` warns on every access through
``vllm_omni.errors`` (the package's ``__getattr__``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import NoReturn

from vllm_omni.errors.details import DEFAULT_TYPE, STATUS_RANGES
from vllm_omni.errors.types import OmniClientError

__all__ = [
    "DEFAULT_CLIENT_ERROR_TYPE",
    "client_error_from_metadata",
    "client_error_metadata",
    "is_client_error_status",
    "raise_client_error_or",
]

_REMOVAL = "It will be removed in the next release; use OmniErrorDetails instead."
_CLIENT_STATUSES = STATUS_RANGES["client"]

# 0.30's default ``error_type`` of ``OmniClientError``; here a client error
# without a type gets its status's type (``HTTP_STATUS_TYPES``).
DEFAULT_CLIENT_ERROR_TYPE = DEFAULT_TYPE["client"]


def _deprecated(name: str) -> None:
    warnings.warn(
        f"vllm_omni.errors.{name} is deprecated. {_REMOVAL}",
        DeprecationWarning,
        stacklevel=3,
    )


def client_error_metadata(exc: BaseException) -> tuple[int | None, str | None]:
    """Deprecated: ``(status_code, error_type)`` of an ``OmniClientError``."""
    _deprecated("client_error_metadata")
    if isinstance(exc, OmniClientError):
        return exc.status_code, exc.error_type
    return None, None


def client_error_from_metadata(
    message: str, *, status_code: int | None, error_type: str | None
) -> OmniClientError:
    """Deprecated: build an ``OmniClientError`` from flat fields."""
    _deprecated("client_error_from_metadata")
    return OmniClientError(
        message, status_code=status_code or 400, error_type=error_type or None
    )


def is_client_error_status(status_code: int | None) -> bool:
    """Deprecated: whether a status number is 4xx."""
    _deprecated("is_client_error_status")
    return status_code is not None and int(status_code) in _CLIENT_STATUSES


def raise_client_error_or(
    message: str,
    *,
    status_code: int | None,
    error_type: str | None,
    fallback: Callable[[str], BaseException],
) -> NoReturn:
    """Deprecated: raise a client error for a 4xx status, else ``fallback``."""
    _deprecated("raise_client_error_or")
    if status_code is not None and int(status_code) in _CLIENT_STATUSES:
        raise OmniClientError(
            message, status_code=status_code, error_type=error_type or None
        )
    raise fallback(message)
