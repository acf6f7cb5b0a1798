"""``vllm_omni.engine.liveness``: when a watcher's own pause is credited.

The drill on real processes is
``tests/engine/test_fatal.py::test_a_machine_wide_pause_is_not_a_stage_death``.
"""

from __future__ import annotations

import pytest

from vllm_omni.engine.liveness import STALL_TOLERANCE_S, credited, stalled


@pytest.mark.parametrize(
    ("previous", "now", "interval", "expected"),
    [
        (10.0, 10.1, 0.1, 0.0),  # on time
        (10.0, 11.0, 0.1, 0.0),  # 0.9 s late: a busy loop, not a pause
        (10.0, 10.2 + STALL_TOLERANCE_S, 0.1, 0.1 + STALL_TOLERANCE_S),  # just past it
        (10.0, 22.1, 0.1, 12.0),  # a 12 s pause
        (10.0, 12.0, 0.25, 1.75),  # the stage's watcher, 1.75 s late
    ],
)
def test_stalled_is_the_lateness_beyond_the_tolerance(
    previous: float, now: float, interval: float, expected: float
) -> None:
    assert stalled(previous, now, interval) == pytest.approx(expected)


def test_credit_moves_last_heard_forward_but_never_past_now() -> None:
    # Heard 0.5 s before a 12 s pause: still 0.5 s of silence after it.
    assert credited(last_heard=9.5, paused=12.0, now=22.0) == 21.5
    # Heard during the pause's last moments (a message read first): not
    # moved into the future.
    assert credited(last_heard=21.9, paused=12.0, now=22.0) == 22.0
