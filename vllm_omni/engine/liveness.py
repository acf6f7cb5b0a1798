"""Silence counted in awake time, on both ends of the stage wire.

A watcher that wakes more than ``STALL_TOLERANCE_S`` late credits the pause
to every peer's last-heard time before judging it (docs/runtime.md §6).
"""

from __future__ import annotations

# Later than this past its interval, a watcher's loop counts as paused (a
# busy loop's lateness stays well below it).
STALL_TOLERANCE_S = 1.0


def stalled(previous: float, now: float, interval: float) -> float:
    """Seconds a watcher that slept ``interval`` after ``previous`` (same
    clock as ``now``) did not run beyond ``STALL_TOLERANCE_S``; 0.0 when it
    woke about on time."""
    late = now - previous - interval
    return late if late > STALL_TOLERANCE_S else 0.0


def credited(last_heard: float, paused: float, now: float) -> float:
    """``last_heard`` moved forward by a pause of ``paused`` seconds, never
    past ``now``."""
    return min(last_heard + paused, now)
