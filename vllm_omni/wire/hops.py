"""Hop timestamps: where a request's time goes between the caller and the engine.

Off unless ``VLLM_OMNI_TRACE_HOPS=1`` (``mark`` is then one global read); on,
each process keeps its marks until ``take`` (docs/runtime.md §13). It must
not change what any hop does: it only records when.
"""

from __future__ import annotations

import os
import time

__all__ = ["ENV", "Mark", "enabled", "mark", "take"]

ENV = "VLLM_OMNI_TRACE_HOPS"

Mark = tuple[str, str, int, int]  # request id, point, stage id (-1: none), ns

_marks: list[Mark] | None = [] if os.environ.get(ENV) == "1" else None


def enabled() -> bool:
    """Whether this process records hops."""
    return _marks is not None


def mark(request_id: str, point: str, stage_id: int = -1) -> None:
    """Record that ``request_id`` reached ``point`` now (when enabled)."""
    if _marks is not None:
        _marks.append((request_id, point, stage_id, time.perf_counter_ns()))


def take() -> list[Mark]:
    """The marks recorded so far, oldest first; they are forgotten here."""
    if _marks is None:
        return []
    taken = list(_marks)
    _marks.clear()
    return taken
