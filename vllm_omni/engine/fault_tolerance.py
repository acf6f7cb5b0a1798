"""Reads what a stage reports of its engine's fault tolerance (docs/runtime.md §8).

``StageFault`` keeps one stage's last status, recovery window and recovery in
flight. It decides nothing about requests (``recovery`` does) and must not
import vLLM: the status crosses the wire as plain data, checked here.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from vllm_omni.errors.details import MAX_RETRY_AFTER_S
from vllm_omni.errors.sanitize import sanitize_message

__all__ = [
    "DEAD",
    "DIAGNOSING",
    "FAULTED",
    "HEALTHY",
    "INSTRUCTIONS",
    "STATUSES",
    "UNHEALTHY",
    "Change",
    "StageFault",
    "checked_result",
    "checked_status",
    "recovery_request_id",
]

# vLLM 0.34's ``EngineStatusType`` names, lower-cased as its engine pushes them.
HEALTHY = "healthy"
DIAGNOSING = "diagnosing"
UNHEALTHY = "unhealthy"
DEAD = "dead"
STATUSES = (HEALTHY, DIAGNOSING, UNHEALTHY, DEAD)
# Faulted: the engine refuses new requests and waits for a recovery.
FAULTED = frozenset({DIAGNOSING, UNHEALTHY})
# vLLM 0.34's ``ALLOWED_FT_INSTRUCTIONS``.
INSTRUCTIONS = frozenset({"retry", "scale_down"})
# After a failed recovery, the next automatic one waits this long, doubling
# up to the cap (the engine's own window bounds the attempts).
_BACKOFF_S = 1.0
_MAX_BACKOFF_S = 10.0
_TEXT_KEYS = ("fault_info", "ft_state", "last_ft_request_id", "ft_error")

Change = Literal["faulted", "recovered", "dead"]


def checked_status(raw: object) -> dict[str, Any] | None:
    """A reported ``engine_status`` entry with only the fields 0.34 defines,
    each of its type and sanitized; ``None`` for no status (the stage has no
    fault tolerance) or one that is not a status at all."""
    if not isinstance(raw, Mapping) or raw.get("status") not in STATUSES:
        return None
    status: dict[str, Any] = {"status": raw["status"]}
    engine = raw.get("id")
    if isinstance(engine, int) and not isinstance(engine, bool):
        status["id"] = engine
    for key in _TEXT_KEYS:
        value = raw.get(key)
        if isinstance(value, str) and value:
            status[key] = sanitize_message(value)[:200]
    mask = raw.get("mask")
    if isinstance(mask, list) and all(
        isinstance(bit, int) and not isinstance(bit, bool) for bit in mask
    ):
        status["mask"] = list(mask)
    return status


def checked_result(raw: object, request_id: str) -> dict[str, Any]:
    """A stage's answer to an instruction as 0.34's ``FaultToleranceResult``
    (``request_id``, ``success``, ``reason``); anything else is a failure."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("success"), bool):
        return {"request_id": request_id, "success": False, "reason": "no answer"}
    reason = raw.get("reason")
    return {
        "request_id": request_id,
        "success": raw["success"],
        "reason": sanitize_message(reason)[:200] if isinstance(reason, str) else None,
    }


def recovery_request_id() -> str:
    """The ``request_id`` of a recovery the server starts (0.34 namespaces a
    recovery round's coordination by it)."""
    return f"omni-recovery-{uuid.uuid4().hex}"


@dataclasses.dataclass(slots=True)
class StageFault:
    """One stage's fault tolerance: what it reported, and its recovery."""

    # The last ``engine_status`` reported; None: no fault tolerance.
    status: dict[str, Any] | None = None
    # The engine's ``engine_recovery_timeout_sec``: faulted longer, it dies.
    window_s: float | None = None
    # Loop time the current fault began; None while not faulted.
    since: float | None = None
    # The request id of the recovery in flight, if any.
    recovering: str | None = None
    # No automatic recovery before this loop time (after a failed one).
    not_before: float = 0.0
    failures: int = 0
    # The last recovery's result (0.34's ``FaultToleranceResult`` fields).
    last_result: dict[str, Any] | None = None

    @property
    def state(self) -> str:
        """The engine's status, ``healthy`` for a stage without fault tolerance."""
        return HEALTHY if self.status is None else str(self.status["status"])

    @property
    def faulted(self) -> bool:
        return self.since is not None

    def report(
        self, status: dict[str, Any] | None, window_s: float | None, now: float
    ) -> Change | None:
        """Take a checked status report; the change of state it makes."""
        self.status = status
        if window_s is not None and math.isfinite(window_s) and window_s > 0:
            self.window_s = window_s
        state = self.state
        if state == DEAD:
            return "dead"
        if state in FAULTED and self.since is None:
            self.since = now
            return "faulted"
        if state not in FAULTED and self.since is not None:
            self.since = None
            self.failures = 0
            self.not_before = 0.0
            return "recovered"
        return None

    def faulted_for(self, now: float) -> float:
        """Seconds the current fault has lasted (0.0 while not faulted)."""
        return 0.0 if self.since is None else max(0.0, now - self.since)

    def retry_after_s(self, now: float) -> int | None:
        """Whole seconds left of the recovery window (at least 1), or None
        when the window is not known."""
        if self.window_s is None:
            return None
        left = self.window_s - self.faulted_for(now)
        return min(MAX_RETRY_AFTER_S, max(1, math.ceil(left)))

    def wants_recovery(self, now: float) -> bool:
        """Whether the server should start a recovery now: the engine waits
        for an instruction, none is in flight, and no backoff holds."""
        return (
            self.state == UNHEALTHY
            and self.recovering is None
            and now >= self.not_before
        )

    def begin(self, request_id: str) -> None:
        self.recovering = request_id

    def end(self, result: dict[str, Any], now: float) -> None:
        """The recovery in flight answered (``checked_result``)."""
        self.recovering = None
        self.last_result = result
        if result["success"]:
            # Its engine reports healthy next; no other recovery before that.
            self.failures = 0
            self.not_before = now + _BACKOFF_S
            return
        self.failures += 1
        backoff = _BACKOFF_S * 2 ** (self.failures - 1)
        self.not_before = now + min(_MAX_BACKOFF_S, backoff)
