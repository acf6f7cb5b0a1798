"""Offline calls never leave work behind (§9): ``generate(timeout=…)``,
Ctrl-C while waiting, and an ``Omni`` dropped without ``close()``."""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
import warnings
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


def _waiting_for_results(thread_id: int) -> bool:
    """Whether that thread still waits in ``Omni.generate`` for the results
    (not yet aborting): where a Ctrl-C lands on ``future.result``."""
    frame = sys._current_frames().get(thread_id)
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return "generate" in names and "_abort" not in names and "result" in names


def test_ctrl_c_aborts_the_whole_batch_everywhere(omni: Omni) -> None:
    main = threading.main_thread()
    assert main.ident is not None
    # A Ctrl-C needs Python's own handler, and SIGINT not blocked, here.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    before = stats(omni)
    cancelled = local("vllm_omni:aborts_total", reason="cancelled")
    presses: list[float] = []
    done = threading.Event()

    def ctrl_c() -> None:
        # What Ctrl-C does: SIGINT to the main thread, blocked waiting for
        # results. One CI run (of many) saw the main thread wait on after it:
        # a Ctrl-C the process did not act on is pressed again, as a user
        # would, while the call still waits (at most twice more).
        while len(presses) < 3 and not done.wait(0.5 if not presses else 5.0):
            if presses and not _waiting_for_results(main.ident):
                return
            presses.append(time.monotonic())
            signal.pthread_kill(main.ident, signal.SIGINT)

    presser = threading.Thread(target=ctrl_c, name="ctrl-c")
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            omni.generate(["one @hang", "two @hang", "three @hang"])
    finally:
        done.set()
        presser.join()
    if len(presses) > 1:
        warnings.warn(
            f"Ctrl-C was pressed {len(presses)} times before generate raised",
            stacklevel=1,
        )
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
