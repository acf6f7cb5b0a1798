"""A stage takes the processes it started with it (issue 15: a ``vllm``
stage killed while its ``AsyncLLM`` started left its EngineCore running,
re-parented to init).

The launcher makes each stage the leader of a process group of its own;
``StageProcess.kill`` (the orchestrator's startup timeout, ``close``, the
finalizer) kills that group, and the launcher kills what is left of it when it
reaps a stage that died. Real processes: a stage forked by the launcher's own
``_spawn`` starts a grandchild, as a ``vllm`` stage starts its EngineCore.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Any

import psutil

from vllm_omni.engine import launcher
from vllm_omni.engine.processes import StageProcess

_SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _spawn_stage(then_exit: bool) -> tuple[int, int]:
    """A stage forked like the launcher forks one; it starts a grandchild and
    reports its pid, then sleeps (or exits 3, as a crash would)."""
    read_fd, write_fd = os.pipe()

    def run(_: Any) -> None:
        child = subprocess.Popen(_SLEEPER)
        os.write(write_fd, f"{child.pid}\n".encode())
        if then_exit:
            os._exit(3)
        time.sleep(120)

    pid = launcher._spawn(None, [read_fd], run)
    os.close(write_fd)
    with os.fdopen(read_fd) as reader:
        grandchild = int(reader.readline())
    return pid, grandchild


def _cleanup(*pids: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pids[0], 0)


def test_each_stage_leads_its_own_process_group() -> None:
    stage, grandchild = _spawn_stage(then_exit=False)
    try:
        assert os.getpgid(stage) == stage != os.getpgid(0)
        assert os.getpgid(grandchild) == stage
    finally:
        _cleanup(stage, grandchild)


def test_killing_a_stage_kills_what_it_started() -> None:
    stage, grandchild = _spawn_stage(then_exit=False)
    try:
        StageProcess(stage, "vllm").kill()
        assert _gone(grandchild)
        _, status = os.waitpid(stage, 0)
        assert os.waitstatus_to_exitcode(status) == -9
    finally:
        _cleanup(stage, grandchild)


_REAP_PROBE = r"""
import json, os, subprocess, sys, time
from multiprocessing import Pipe
from vllm_omni.engine import launcher
read_fd, write_fd = os.pipe()

def run(_):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    os.write(write_fd, f"{child.pid}\n".encode())
    os._exit(3)  # the stage dies; its grandchild would live on

stage = launcher._spawn(None, [read_fd], run)
os.close(write_fd)
grandchild = int(os.fdopen(read_fd).readline())
events_in, events_out = Pipe(duplex=False)
children = {stage}
deadline = time.monotonic() + 10
while children and time.monotonic() < deadline:
    launcher._reap(children, events_out)
    time.sleep(0.02)
event = list(events_in.recv())
print(json.dumps({"event": event, "stage": stage, "grandchild": grandchild}))
"""


def test_a_stage_that_died_is_reaped_with_its_group() -> None:
    """In a process of its own: the launcher reaps any child (waitpid -1)."""
    done = subprocess.run(
        [sys.executable, "-c", _REAP_PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result = json.loads(done.stdout)
    try:
        assert result["event"] == ["exited", result["stage"], 3]
        assert _gone(result["grandchild"])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(result["grandchild"], 9)
