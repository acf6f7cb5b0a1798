"""What a stage reports of its engine's fault tolerance, read field by field
(``vllm_omni/engine/fault_tolerance.py``): only vLLM 0.34's fields, each of
its type and sanitized; the transitions a report makes; the recovery the
server may start (one at a time, a backoff after a failure)."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_omni.engine.fault_tolerance import (
    StageFault,
    checked_result,
    checked_status,
    recovery_request_id,
)


@pytest.mark.parametrize(
    ("raw", "checked"),
    [
        ({"id": 0, "status": "healthy"}, {"id": 0, "status": "healthy"}),
        (
            {
                "id": 0,
                "status": "unhealthy",
                "fault_info": "RuntimeError",
                "mask": [0, 1],
                "ft_state": "recovering",
                "last_ft_request_id": "r-1",
                "extra": object(),
            },
            {
                "id": 0,
                "status": "unhealthy",
                "fault_info": "RuntimeError",
                "mask": [0, 1],
                "ft_state": "recovering",
                "last_ft_request_id": "r-1",
            },
        ),
        # A path or a credential in a reason never reaches an operator's route.
        (
            {"status": "unhealthy", "ft_error": "failed /home/alice/x token=hunter2x"},
            {"status": "unhealthy", "ft_error": "failed <path> token=<redacted>"},
        ),
        ({"id": True, "status": "dead", "mask": [True]}, {"status": "dead"}),
        ({"status": "rebooting"}, None),
        ({}, None),
        (None, None),
        ("healthy", None),
    ],
)
def test_a_status_keeps_only_upstreams_fields(raw: Any, checked: Any) -> None:
    assert checked_status(raw) == checked


def test_a_result_that_is_not_one_is_a_failure() -> None:
    assert checked_result({"success": True, "reason": None}, "r") == {
        "request_id": "r",
        "success": True,
        "reason": None,
    }
    assert checked_result(None, "r")["success"] is False
    assert checked_result({"success": "yes"}, "r")["success"] is False


def test_reports_make_the_changes_and_drive_one_recovery_at_a_time() -> None:
    fault = StageFault()
    assert fault.report({"status": "healthy"}, 30.0, now=0.0) is None
    assert not fault.wants_recovery(0.0)
    assert fault.report({"status": "diagnosing"}, 30.0, now=1.0) == "faulted"
    assert not fault.wants_recovery(1.0)  # the engine takes no instruction yet
    assert fault.report({"status": "unhealthy"}, 30.0, now=1.5) is None
    assert fault.faulted_for(11.0) == 10.0 and fault.retry_after_s(11.0) == 20
    assert fault.wants_recovery(1.5)
    first = recovery_request_id()
    fault.begin(first)
    assert not fault.wants_recovery(2.0)  # one at a time
    fault.end({"request_id": first, "success": False, "reason": "x"}, now=3.0)
    assert not fault.wants_recovery(3.5) and fault.wants_recovery(4.0)  # backoff 1 s
    fault.begin(recovery_request_id())
    fault.end({"request_id": "r", "success": False, "reason": "x"}, now=5.0)
    assert not fault.wants_recovery(6.5) and fault.wants_recovery(7.0)  # then 2 s
    fault.begin(recovery_request_id())
    fault.end({"request_id": "r", "success": True, "reason": None}, now=8.0)
    assert not fault.wants_recovery(8.5)  # its healthy report comes next
    assert fault.report({"status": "healthy"}, 30.0, now=8.6) == "recovered"
    assert fault.faulted_for(9.0) == 0.0 and not fault.faulted
    assert fault.report({"status": "dead"}, None, now=9.0) == "dead"
    assert recovery_request_id() != recovery_request_id()
