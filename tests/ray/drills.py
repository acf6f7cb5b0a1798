"""Shared pieces of the Ray drills: Ray settings and a small pipeline."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import psutil

# Detect a lost node within about a second (Ray's defaults take ~15 s); the
# operator's knob, documented in docs/serving.md.
FAST_FAILURE_DETECTION: dict[str, Any] = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 300,
    "health_check_timeout_ms": 300,
    "health_check_failure_threshold": 2,
}

# The request-time probe, fast: a stopped actor or GCS is noticed within about
# two seconds, far inside the 10 s heartbeat after which a stage is dead, yet
# slower than a loaded host's slowest healthy ping and than Ray's detection of
# a lost node (FAST_FAILURE_DETECTION, ~0.6 s), which must stay a death.
FAST_PROBE: dict[str, float] = {"probe_interval_s": 0.25, "probe_timeout_s": 1.5}

FAULTS: list[dict[str, Any]] = [
    {"stage": 0, "marker": "@boom", "action": "raise"},
    {
        "stage": 0,
        "marker": "@secret",
        "action": "raise",
        "exception": "builtins:RuntimeError",
        "args": ["failed reading /home/alice/.hf/token hf_SECRETSECRET123"],
    },
    {
        "stage": 0,
        "marker": "@invalid",
        "action": "raise",
        "exception": "vllm.exceptions:VLLMValidationError",
        "args": ["temperature must be positive"],
        "kwargs": {"parameter": "temperature", "value": -1},
    },
    {
        "stage": 1,
        "marker": "@novoice",
        "action": "raise",
        "exception": "vllm.exceptions:VLLMNotFoundError",
        "args": ["voice not found"],
    },
    {
        "stage": 1,
        "marker": "@unavailable",
        "action": "raise",
        "exception": "vllm_omni.errors:OmniServiceUnavailableError",
        "args": ["talker pool drained"],
    },
    {"stage": 0, "marker": "@hang", "action": "hang"},
    {"stage": 1, "marker": "@talkhang", "action": "hang"},
]


def drill_pipeline(
    *,
    thinker_ray: dict[str, Any] | None = None,
    talker_ray: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Thinker (0), talker (1), vocoder (2): text and audio routes, 3 actors."""
    return {
        "model": "omni-ray-drill",
        "worker_backend": "ray",
        "stages": [
            {
                "id": 0,
                "name": "thinker",
                "kind": "text",
                "timeout_s": 30,
                "ray": thinker_ray or {},
            },
            {
                "id": 1,
                "name": "talker",
                "kind": "talker",
                "timeout_s": 30,
                "ray": talker_ray or {},
            },
            {
                "id": 2,
                "name": "vocoder",
                "kind": "vocoder",
                "timeout_s": 30,
                "ray": thinker_ray or {},
            },
        ],
        "faults": FAULTS,
        "ray": FAST_PROBE,
    }


def ping(actor: Any) -> int:
    """The process id of a stage actor's worker, asked through the probe's
    own method (``run`` holds the actor's default group)."""
    import ray

    pid = actor.ping.options(concurrency_group="probe").remote()
    return int(ray.get(pid, timeout=10))


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """SIGSTOP a process for the block; SIGCONT whatever happens in it.

    The stop is checked, not assumed: the block starts once the process is
    stopped, and ends with an error if it ran again meanwhile (a stray
    ``SIGCONT``, from a drill of another run signalling a pid that was
    reused on a busy host, or from the kernel when the process group became
    orphaned). A stage answering inside the block then reads as what it is,
    not as a drill that "did not raise".
    """
    process = psutil.Process(pid)
    os.kill(pid, signal.SIGSTOP)
    try:
        _wait_status(process, psutil.STATUS_STOPPED)
        yield
        if process.status() != psutil.STATUS_STOPPED:
            raise AssertionError(f"process {pid} ran again inside the drill")
    finally:
        os.kill(pid, signal.SIGCONT)


def _wait_status(process: psutil.Process, status: str) -> None:
    deadline = time.monotonic() + 5
    while process.status() != status:
        assert time.monotonic() < deadline, (process.pid, process.status())
        time.sleep(0.01)
