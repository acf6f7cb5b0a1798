"""How a failure is accounted: its record, its log line, the error mode.

Owns the log level of a failure (5xx with traceback, 4xx at INFO, expected
refusals (overload, a faulted engine) and replayed job errors at INFO
without one), the legacy-fallback
counter and its once-per-raise-site warning, the mark on a replayed stored
error, and the app's error mode. Must not render: callers do.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from vllm.exceptions import QueueOverflowError

from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.metrics import RAW_FALLBACKS_TOTAL
from vllm_omni.errors.normalizer import (
    Mode,
    is_legacy_fallback,
    logged_by_stage,
    normalize,
)
from vllm_omni.errors.table import row_for
from vllm_omni.errors.types import EngineDeadError

__all__ = [
    "MODES",
    "details_for_exception",
    "error_mode",
    "is_replayed",
    "replayed",
    "set_error_mode",
]

logger = logging.getLogger("vllm_omni.errors")

MODES: tuple[Mode, ...] = ("strict", "legacy")
_MAX_FALLBACK_SITES = 4096
_REPLAYED = "_vllm_omni_replayed"


def set_error_mode(app: Any, mode: Mode) -> None:
    """Set the app's error mode, which the framework handlers and streams read."""
    if mode not in MODES:
        raise RuntimeError(f"error mode must be one of {MODES}, got {mode!r}")
    app.state.error_mode = mode


def error_mode(app: Any) -> Mode:
    """The app's error mode (``strict`` unless installed otherwise)."""
    return getattr(app.state, "error_mode", "strict")


def _raise_site(exc: BaseException) -> str:
    tb = exc.__traceback__
    if tb is None:
        return "<unknown>"
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"


class _FallbackLog:
    """Counts legacy fallback hits; logs each raise site once (bounded)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def hit(self, exc: BaseException, details: OmniErrorDetails) -> None:
        label = row_for(type(exc), True).exc_type.__name__
        RAW_FALLBACKS_TOTAL.labels(label).inc()
        site = _raise_site(exc)
        with self._lock:
            if site in self._seen or len(self._seen) >= _MAX_FALLBACK_SITES:
                return
            self._seen.add(site)
        logger.warning(
            "legacy fallback: raw %s raised at %s rendered as %d %s "
            "(request %s); migrate it to a semantic vllm_omni.errors type",
            label,
            site,
            details.status_code,
            details.error_type,
            details.request_id,
        )


_FALLBACKS = _FallbackLog()


def replayed(exc: BaseException) -> BaseException:
    """Mark an exception rebuilt from a stored record (a failed job read back):
    it was logged when it happened, so reading it back logs at INFO, and a
    repeat would read the same record, so its response says
    ``x-should-retry: false``."""
    setattr(exc, _REPLAYED, True)
    return exc


def is_replayed(exc: BaseException | None) -> bool:
    """Whether ``replayed`` marked ``exc``."""
    return exc is not None and getattr(exc, _REPLAYED, False) is True


def _quiet_reason(exc: BaseException | None, details: OmniErrorDetails) -> str | None:
    """Why a server error is expected and logged at INFO without traceback."""
    # A faulted engine refuses every request until it recovers; the fault
    # itself is the stage's news, not each refusal (vLLM 0.34+).
    if details.faulted:
        return "engine faulted"
    # The engine hands callers a picklable rebuild of upstream's overload
    # error, with the original as its cause.
    if isinstance(exc, QueueOverflowError) or (
        exc is not None and isinstance(exc.__cause__, QueueOverflowError)
    ):
        return "overload"
    if isinstance(exc, EngineDeadError):
        return "engine dead"  # the death itself was logged once, CRITICAL
    if is_replayed(exc):
        return "stored job error"
    return None


def _log(exc: BaseException | None, details: OmniErrorDetails) -> None:
    quiet = _quiet_reason(exc, details) if details.category == "server" else None
    if quiet is not None:
        logger.info(
            "request %s refused with %d %s (%s)",
            details.request_id,
            details.status_code,
            details.error_type,
            quiet,
        )
    elif details.category == "server" and logged_by_stage(exc) is not None:
        # The stage logged the cause with its traceback; this one would show
        # only the way the record came here.
        logger.error(
            "request %s failed with %d %s: %s in stage %d (its log has the cause)",
            details.request_id,
            details.status_code,
            details.error_type,
            type(exc).__name__,
            logged_by_stage(exc),
        )
    elif details.category == "server":
        logger.error(
            "request %s failed with %d %s: %s",
            details.request_id,
            details.status_code,
            details.error_type,
            type(exc).__name__ if exc is not None else "framework error",
            exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None,
        )
    else:
        logger.info(
            "request %s rejected with %d %s",
            details.request_id,
            details.status_code,
            details.error_type,
        )


def details_for_exception(
    exc: BaseException, *, request_id: str | None, mode: Mode = "strict"
) -> OmniErrorDetails:
    """Normalize, then account: fallback counter and log. Never raises."""
    details = normalize(exc, request_id=request_id, mode=mode)
    if mode == "legacy" and is_legacy_fallback(exc):
        _FALLBACKS.hit(exc, details)
    _log(exc, details)
    return details
