"""Silence counted in awake time, on both ends of the stage wire.

Owns one rule: a watcher only counts silence while it was itself running.
The orchestrator marks a stage dead after ``heartbeat_timeout_s`` without a
message from it, and a remote stage exits after ``orchestrator_timeout_s``
without one from the orchestrator. A watcher whose own loop did not run for
a while - its process stopped or starved, or the whole machine paused (a
busy VM host, a suspended laptop) - heard nothing in that time because it
was not listening, and a peer paused with it had nothing to say: judged
right after such a pause, a healthy peer looked dead (measured: a 12 s
pause of a Ray stage and of the orchestrator's loop together marked the
engine dead). So a watcher that wakes more than ``STALL_TOLERANCE_S`` later
than it asked to credits that time to every peer's last-heard time before
judging; a peer that is really gone stays silent and is judged after the
timeout of awake time. A watcher stopped alone never needed this: its
peers' messages wait in its socket and are read first.
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
