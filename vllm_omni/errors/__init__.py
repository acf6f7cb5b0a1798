"""vLLM-Omni error handling: one owner, one record, one renderer per transport.

Public surface (docs/design.md §2–§5): upstream vLLM's semantic exceptions re-exported
by identity, the Omni subtypes, ``OmniErrorDetails``, ``normalize`` /
``to_exception``, the sanitizer and the status table. Attributes load lazily,
as vLLM's own ``__init__`` does, so ``vllm_omni.errors.details`` can be
used without importing vLLM or torch.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from importlib import _bootstrap  # type: ignore[attr-defined]
from typing import TYPE_CHECKING, Any

_TYPES = "vllm_omni.errors.types"
_LAZY: dict[str, str] = {
    **{
        name: _TYPES
        for name in (
            "VLLMError",
            "VLLMClientError",
            "VLLMServerError",
            "VLLMValidationError",
            "VLLMNotFoundError",
            "VLLMUnprocessableEntityError",
            "GenerationError",
            "GracefulHTTPError",
            "EngineGenerateError",
            "EngineDeadError",
            "GuardrailViolationError",
            "OmniConflictError",
            "OmniNotImplementedError",
            "OmniServiceUnavailableError",
            "OmniStageTimeoutError",
            "OmniEngineGenerateError",
            "OmniEngineDeadError",
            "OmniClientError",
            "OmniServerError",
            "RemoteGuardrailViolationError",
            "RemoteOmniConflictError",
            "RemoteOmniNotImplementedError",
            "RemoteOmniServiceUnavailableError",
            "RemoteOmniStageTimeoutError",
            "RemoteVLLMNotFoundError",
            "RemoteVLLMUnprocessableEntityError",
            "RemoteVLLMValidationError",
        )
    },
    "OmniErrorDetails": "vllm_omni.errors.details",
    "GENERIC_SERVER_MESSAGE": "vllm_omni.errors.details",
    "normalize": "vllm_omni.errors.normalizer",
    "to_exception": "vllm_omni.errors.normalizer",
    "for_caller": "vllm_omni.errors.normalizer",
    "fatal_reason": "vllm_omni.errors.normalizer",
    "raise_for_caller": "vllm_omni.errors.normalizer",
    "from_request_error": "vllm_omni.errors.normalizer",
    "is_legacy_fallback": "vllm_omni.errors.normalizer",
    "sanitize_message": "vllm_omni.errors.sanitize",
    "sanitize_parameter": "vllm_omni.errors.sanitize",
    "sanitize_request_id": "vllm_omni.errors.sanitize",
    "STATUS_TABLE": "vllm_omni.errors.table",
    "LEGACY_FALLBACKS": "vllm_omni.errors.table",
    "client_error_metadata": "vllm_omni.errors.compat",
    "client_error_from_metadata": "vllm_omni.errors.compat",
    "is_client_error_status": "vllm_omni.errors.compat",
    "raise_client_error_or": "vllm_omni.errors.compat",
}

# Names that exist only where the installed vLLM defines their class
# (``types.UPSTREAM_SINCE``), by the upstream class each needs: resolved like
# the rest, an AttributeError on an older vLLM, and left out of ``__all__``,
# which cannot know without importing vLLM.
_NEWER_UPSTREAM: dict[str, str] = {
    "EngineFaultedError": "EngineFaultedError",
    "RemoteEngineFaultedError": "EngineFaultedError",
}

if TYPE_CHECKING:
    from vllm_omni.errors.compat import (
        client_error_from_metadata,
        client_error_metadata,
        is_client_error_status,
        raise_client_error_or,
    )
    from vllm_omni.errors.details import GENERIC_SERVER_MESSAGE, OmniErrorDetails
    from vllm_omni.errors.normalizer import (
        fatal_reason,
        for_caller,
        from_request_error,
        is_legacy_fallback,
        normalize,
        raise_for_caller,
        to_exception,
    )
    from vllm_omni.errors.sanitize import (
        sanitize_message,
        sanitize_parameter,
        sanitize_request_id,
    )
    from vllm_omni.errors.table import LEGACY_FALLBACKS, STATUS_TABLE
    from vllm_omni.errors.types import (
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
        RemoteGuardrailViolationError,
        RemoteOmniConflictError,
        RemoteOmniNotImplementedError,
        RemoteOmniServiceUnavailableError,
        RemoteOmniStageTimeoutError,
        RemoteVLLMNotFoundError,
        RemoteVLLMUnprocessableEntityError,
        RemoteVLLMValidationError,
        VLLMClientError,
        VLLMError,
        VLLMNotFoundError,
        VLLMServerError,
        VLLMUnprocessableEntityError,
        VLLMValidationError,
    )

__all__ = sorted(_LAZY)


# Deprecated 0.30 constants (in ``compat``) and what replaces each. Never
# cached here, so every access warns, at the reader's line (Python shows
# each line's warning once); left out of ``__all__``, so ``import *`` does
# not warn.
_DEPRECATED: dict[str, str] = {
    "DEFAULT_CLIENT_ERROR_TYPE": "a client error without a type now gets its "
    "status's type (OmniErrorDetails.error_type)",
}


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        # ``from vllm_omni.errors import NAME`` looks NAME up twice: importlib's
        # ``_handle_fromlist`` probes it, then the statement reads it. Only
        # the read warns, so each import warns once.
        if sys._getframe(1).f_code is not _bootstrap._handle_fromlist.__code__:
            warnings.warn(
                f"vllm_omni.errors.{name} is deprecated and will be removed in "
                f"the next release: {_DEPRECATED[name]}.",
                DeprecationWarning,
                stacklevel=2,
            )
        return getattr(importlib.import_module("vllm_omni.errors.compat"), name)
    module = _LAZY.get(name) or (_TYPES if name in _NEWER_UPSTREAM else None)
    if module is None:
        raise AttributeError(f"module 'vllm_omni.errors' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    try:
        value = getattr(loaded, name)
    except AttributeError:
        since = loaded.UPSTREAM_SINCE[_NEWER_UPSTREAM[name]]
        raise AttributeError(
            f"module 'vllm_omni.errors' has no attribute {name!r}: the installed "
            f"vLLM does not define it (vLLM {since}+)"
        ) from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_DEPRECATED))
