"""Hop timestamps: where a request's time goes between the caller and the engine.

Owns the per-hop marks behind the breakdown in ``docs/performance.md``
(``benchmarks/bench_real_engine.py --breakdown``). Off unless
``VLLM_OMNI_TRACE_HOPS=1`` is in the environment when this module is first
imported: the engine's process, and the stage processes (forks of a
launcher that inherits the environment). Off, ``mark`` is one global read;
nothing is recorded and nothing crosses the wire.

On, each process keeps ``(request id, point, time)`` in memory, the time
from ``time.perf_counter_ns`` (the system's monotonic clock on Linux, so
marks of different processes of one machine compare). ``take`` hands them
over and forgets them; a stage hands its own over through the ``hops``
utility (``Orchestrator.call_utility("hops")``). Points name the process
side and the step (``orchestrator.submit``, ``stage.received``, …), with
the stage the step is about. A step that sends is marked before the send
(except ``stage.sent``, right after it): the receiver's mark may come first.

This module must not change what any hop does: it only records when.
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
