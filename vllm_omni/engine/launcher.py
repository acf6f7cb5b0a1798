"""The stage launcher process: ``python -m vllm_omni.engine.launcher``.

Imports vLLM once and forks one stage process per request over two pipes;
its end of input stops every stage it made (docs/runtime.md §2). It must not
decide anything about requests or errors: stages and the orchestrator speak
over ZMQ.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn

__all__ = ["main", "serve", "serve_forked"]

# Stages get this long to stop on SIGTERM when the launcher's user is gone.
_STOP_GRACE_S = 1.0
# The reference stages' modules (numpy, Pillow): imported once here rather
# than once per stage. The vLLM backend loads its engine itself.
_PRELOAD = (
    "vllm_omni.stages.guardrail",
    "vllm_omni.stages.text",
    "vllm_omni.stages.speech",
    "vllm_omni.stages.image",
    "vllm_omni.stages.video",
)


class _Stop(Exception):
    """SIGTERM: stop the stages and exit."""


def _on_sigterm(*_: object) -> None:
    raise _Stop


def _exit_on_eof(commands: Connection, importing: threading.Event) -> None:
    """While the main thread imports, exit as soon as the parent is gone (the
    parent sends nothing before ``ready``, so readable means end of input)."""
    while importing.is_set():
        if commands.poll(0.05):
            os._exit(0)


def _reap(children: set[int], events: Connection) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        _end_group(pid)
        events.send(("exited", pid, os.waitstatus_to_exitcode(status)))


def _end_group(pid: int) -> None:
    """Kill what is left of a stage's process group: a stage that died
    (killed, crashed, timed out starting) leaves its EngineCore orphaned
    otherwise, re-parented to init and still holding memory."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _spawn(spec: Any, closing: list[int], run: Any) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            # Each stage leads a process group of its own, which the processes
            # it starts (a vllm stage's EngineCore and model worker) join: a
            # stage killed, or dead, takes them with it (_end_group).
            os.setpgid(0, 0)
            for fd in closing:
                os.close(fd)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            run(spec)  # exits the process itself
        finally:
            os._exit(code)
    # Here too, so the group exists before anyone learns the pid.
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    return pid


def _stop(children: set[int], events: Connection) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE_S
    while children and time.monotonic() < deadline:
        with contextlib.suppress(OSError, BrokenPipeError):
            _reap(children, events)
        time.sleep(0.02)
    for pid in children:
        _end_group(pid)


def main() -> int:
    """``python -m vllm_omni.engine.launcher``: the protocol on stdin/stdout."""
    commands = Connection(os.dup(0), writable=False)
    events = Connection(os.dup(1), readable=False)
    # Anything a stage prints goes to stderr, never into the protocol.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return serve(commands, events)


def serve_forked(commands_fd: int, events_fd: int) -> NoReturn:
    """The launcher as a fork of a process that already imported the stage
    worker (``vllm-omni serve``): no second vLLM import. Keeps only stdio and
    the two pipes, so no stage holds the server's socket or job store lock."""
    os.setsid()
    keep = {0, 1, 2, commands_fd, events_fd}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            if int(name) not in keep:
                with contextlib.suppress(OSError):
                    os.close(int(name))
    code = 1
    try:
        code = serve(
            Connection(commands_fd, writable=False),
            Connection(events_fd, readable=False),
        )
    finally:
        os._exit(code)


def serve(commands: Connection, events: Connection) -> int:
    """Fork stages on request until the parent closes ``commands``."""
    # Ctrl-C reaches the whole process group; the parent decides when to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, _on_sigterm)

    # The one expensive import, done once for every stage forked below. A
    # parent that exits meanwhile (a server failing its startup) must not
    # leave us importing for seconds: a watcher ends the process on EOF.
    importing = threading.Event()
    importing.set()
    watcher = threading.Thread(target=_exit_on_eof, args=(commands, importing))
    watcher.start()
    try:
        from vllm_omni.engine.stage_worker import run_stage_process

        for module in _PRELOAD:
            importlib.import_module(module)
    finally:
        importing.clear()
        watcher.join()  # no thread may be running when we fork

    events.send(("ready", os.getpid()))
    children: set[int] = set()
    closing = [commands.fileno(), events.fileno(), wake_r, wake_w]
    try:
        while True:
            ready = wait([commands, wake_r], timeout=1.0)
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
            _reap(children, events)
            if commands not in ready:
                continue
            try:
                message = commands.recv()
            except EOFError:
                break
            kind, token, spec = message
            if kind != "spawn":
                continue
            try:
                pid = _spawn(spec, closing, run_stage_process)
            except OSError as exc:
                events.send(("failed", token, f"{type(exc).__name__}: {exc}"))
            else:
                children.add(pid)
                events.send(("started", token, pid))
    except (BrokenPipeError, ConnectionResetError, _Stop):
        pass  # the parent is gone or told us to stop: stop the stages below
    _stop(children, events)
    return 0


if __name__ == "__main__":
    sys.exit(main())
