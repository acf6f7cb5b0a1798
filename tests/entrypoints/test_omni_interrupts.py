"""Offline calls never leave work behind (§9): ``generate(timeout=…)``,
Ctrl-C while waiting, and an ``Omni`` dropped without ``close()``."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.prom import local
from vllm_omni.entrypoints.omni import Omni
from vllm_omni.errors import OmniStageTimeoutError

pytestmark = pytest.mark.timeout(90)

STAGES = (0, 1)
PIPELINE = {
    "model": "omni-offline",
    "stages": [
        {"id": 0, "name": "guardrail", "kind": "guardrail"},
        {"id": 1, "name": "thinker", "kind": "text"},
    ],
    "faults": [{"stage": 1, "marker": "@hang", "action": "hang"}],
}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("offline") / "pipeline.yaml"
    path.write_text(yaml.safe_dump(PIPELINE))
    return path


@pytest.fixture(scope="module")
def omni(pipeline: Path) -> Iterator[Omni]:
    with Omni(pipeline=pipeline) as omni:
        yield omni


def stats(omni: Omni) -> dict[int, Any]:
    return omni._call(omni.engine.stage_stats())


def new_aborts(before: dict[int, Any], after: dict[int, Any], stage: int) -> list[str]:
    return [rid for rid in after[stage]["aborts"] if rid not in before[stage]["aborts"]]


def wait_until_idle(omni: Omni, before: dict[int, Any], count: int) -> dict[int, Any]:
    """Every stage heard ``count`` new aborts and runs nothing (within 1 s)."""
    deadline = time.monotonic() + 1.0
    while True:
        now = stats(omni)
        done = all(len(new_aborts(before, now, s)) == count for s in STAGES)
        if done and not any(now[s]["active"] for s in STAGES):
            return now
        assert time.monotonic() < deadline, now
        time.sleep(0.02)


def test_timeout_raises_504_and_aborts_everywhere(omni: Omni) -> None:
    before = stats(omni)
    aborts = local("vllm_omni:aborts_total", reason="abort")
    with pytest.raises(OmniStageTimeoutError) as info:
        omni.generate("wait @hang", timeout=0.5)
    assert info.value.status_code == 504
    after = wait_until_idle(omni, before, 1)
    assert new_aborts(before, after, 0) == new_aborts(before, after, 1)
    assert local("vllm_omni:aborts_total", reason="abort") == aborts + 1
    # The engine is fine afterwards.
    assert omni.generate("hello", timeout=10).text.startswith("You said")


@pytest.fixture
def ctrl_c_reaches_python() -> Iterator[None]:
    """SIGINT as in an interactive process: Python's handler, not blocked.

    A process started in the background by a shell without job control
    (``.ci/run &`` from a script, ``nohup``) inherits SIGINT ignored, and
    Python then leaves it ignored: a Ctrl-C could never reach it. That is
    how a CI run once waited here 90 s for a SIGINT that was ignored.
    """
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, handler)


@pytest.mark.usefixtures("ctrl_c_reaches_python")
def test_ctrl_c_aborts_the_whole_batch_everywhere(omni: Omni) -> None:
    before = stats(omni)
    cancelled = local("vllm_omni:aborts_total", reason="cancelled")
    # What Ctrl-C does: SIGINT to the main thread, blocked waiting for results.
    timer = threading.Timer(
        0.5, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)
    )
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            omni.generate(["one @hang", "two @hang", "three @hang"])
    finally:
        timer.cancel()
    wait_until_idle(omni, before, 3)
    assert local("vllm_omni:aborts_total", reason="cancelled") == cancelled + 3
    assert local("vllm_omni:requests_in_flight") == 0


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] == "Z"
    except FileNotFoundError:
        return True


def test_dropped_omni_stops_stages_and_loop_thread(pipeline: Path) -> None:
    omni = Omni(pipeline=pipeline)
    pids = [pid for pid in omni.engine.stage_pids().values() if pid is not None]
    thread = omni._thread
    # The thinker's process; the guardrail runs in this one.
    assert len(pids) == 1 and thread.is_alive()
    del omni
    gc.collect()
    deadline = time.monotonic() + 2.0
    while not all(_gone(pid) for pid in pids) or thread.is_alive():
        assert time.monotonic() < deadline, "the dropped Omni left work running"
        time.sleep(0.05)
