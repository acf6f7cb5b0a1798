"""How stage processes are made: our own launcher process, cheap forks.

Leases one launcher per process to every engine and answers for its stages
like ``multiprocessing.Process`` (docs/runtime.md §2). Cheap to import (no
vLLM), so an entrypoint can call ``start_launcher()`` first thing.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

__all__ = [
    "LAUNCHER_MODULE",
    "LauncherError",
    "Lease",
    "StageProcess",
    "acquire",
    "hold",
    "start_launcher",
]

LAUNCHER_MODULE = "vllm_omni.engine.launcher"
_WORKER_MODULE = "vllm_omni.engine.stage_worker"
_READY_TIMEOUT_S = 300.0
_CLOSE_TIMEOUT_S = 2.0


class LauncherError(RuntimeError):
    """The launcher could not start a stage (it died, or fork failed)."""


class StageProcess:
    """A stage process forked by the launcher, seen from the engine's process."""

    def __init__(self, pid: int, name: str) -> None:
        self.pid = pid
        self.name = name
        self._exitcode: int | None = None
        self._exited = threading.Event()

    @property
    def exitcode(self) -> int | None:
        return self._exitcode

    def is_alive(self) -> bool:
        return not self._exited.is_set()

    def join(self, timeout: float | None = None) -> None:
        self._exited.wait(timeout)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the stage and its process group (the launcher makes each
        stage a group leader): what it started dies with it."""
        if not self._exited.is_set():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        if not self._exited.is_set():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signum)

    def _set_exit(self, code: int) -> None:
        if not self._exited.is_set():
            self._exitcode = code
            self._exited.set()


class _ForkedProcess:
    """The ``Popen`` surface ``_Launcher`` uses, for a launcher made by fork."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid == 0:
                    return None
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(LAUNCHER_MODULE, timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _can_fork() -> bool:
    """Forking this process is safe and saves the import: single-threaded
    (at the Python level), with the stage worker (vLLM) already imported."""
    return threading.active_count() == 1 and _WORKER_MODULE in sys.modules


class _Launcher:
    """One launcher process and the thread that reads what it reports."""

    def __init__(self, *, fork: bool = False) -> None:
        to_child, self._to_launcher = os.pipe()
        self._from_launcher, from_child = os.pipe()
        self.process: subprocess.Popen[bytes] | _ForkedProcess
        try:
            if fork:
                self.process = self._fork(to_child, from_child)
            else:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", LAUNCHER_MODULE],
                    stdin=to_child,
                    stdout=from_child,
                    close_fds=True,
                    # Only the parent decides when stages stop (Ctrl-C too).
                    start_new_session=True,
                )
        finally:
            os.close(to_child)
            os.close(from_child)
        self._commands = Connection(self._to_launcher, readable=False)
        self._events = Connection(self._from_launcher, writable=False)
        self._send_lock = threading.Lock()
        self._ready = threading.Event()
        self._gone = threading.Event()
        self._tokens = itertools.count(1)
        self._pending: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._stages: dict[int, StageProcess] = {}
        self._early_exits: dict[int, int] = {}
        self._state = threading.Lock()
        threading.Thread(
            target=self._read, name="omni-launcher-reader", daemon=True
        ).start()

    def _fork(self, to_child: int, from_child: int) -> _ForkedProcess:
        pid = os.fork()
        if pid == 0:  # the launcher: never returns
            os.close(self._to_launcher)
            os.close(self._from_launcher)
            from vllm_omni.engine.launcher import serve_forked

            serve_forked(to_child, from_child)
        return _ForkedProcess(pid)

    def _read(self) -> None:
        try:
            while True:
                event = self._events.recv()
                self._on_event(event)
        except (EOFError, OSError):
            pass
        finally:
            self._on_gone()

    def _on_event(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "ready":
            self._ready.set()
        elif kind in ("started", "failed"):
            with self._state:
                waiter = self._pending.pop(event[1], None)
            if waiter is not None:
                waiter[1].append(event)
                waiter[0].set()
        elif kind == "exited":
            _, pid, code = event
            with self._state:
                stage = self._stages.pop(pid, None)
                if stage is None:  # reaped before "started" was read
                    self._early_exits[pid] = code
            if stage is not None:
                stage._set_exit(code)

    def _on_gone(self) -> None:
        self._gone.set()
        self._ready.set()
        code = self.process.wait()
        with self._state:
            stages = list(self._stages.values())
            self._stages.clear()
            waiters = list(self._pending.values())
            self._pending.clear()
        # Orphaned stages exit on their own within a fraction of a second.
        for stage in stages:
            stage._set_exit(code if code > 0 else 1)
        for event, _ in waiters:
            event.set()

    def start_stage(self, spec: Any, name: str) -> StageProcess:
        """Fork a stage process running ``run_stage_process(spec)``."""
        self._ready.wait(_READY_TIMEOUT_S)
        if self._gone.is_set():
            raise LauncherError(self._why_gone())
        token = next(self._tokens)
        done = threading.Event()
        reply: list[Any] = []
        with self._state:
            self._pending[token] = (done, reply)
        try:
            with self._send_lock:
                self._commands.send(("spawn", token, spec))
        except OSError:
            raise LauncherError(self._why_gone()) from None
        done.wait()
        if not reply:
            raise LauncherError(self._why_gone())
        kind, _, value = reply[0]
        if kind == "failed":
            raise LauncherError(f"the stage launcher could not fork: {value}")
        stage = StageProcess(value, name)
        with self._state:
            early = self._early_exits.pop(value, None)
            if early is None:
                self._stages[value] = stage
        if early is not None:
            stage._set_exit(early)
        return stage

    def _why_gone(self) -> str:
        code = self.process.poll()
        if code is None:
            return "the stage launcher stopped answering"
        return f"the stage launcher exited with code {code}"

    @property
    def alive(self) -> bool:
        return not self._gone.is_set()

    def close(self) -> None:
        """End of input: the launcher stops its stages and exits."""
        with self._send_lock:
            self._commands.close()
        try:
            self.process.wait(_CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Lease:
    """An engine's use of the shared launcher; release it exactly once."""

    def __init__(self, launcher: _Launcher) -> None:
        self.launcher = launcher
        self._released = False

    def start_stage(self, spec: Any, name: str) -> StageProcess:
        return self.launcher.start_stage(spec, name)

    def release(self) -> None:
        with _lock:
            if self._released:
                return
            self._released = True
        _release(self.launcher)


_lock = threading.Lock()
_launcher: _Launcher | None = None
_users = 0
_held = False


def _current(*, fork: bool = False) -> _Launcher:
    """The running launcher, started if needed (call with ``_lock`` held)."""
    global _launcher
    if _launcher is None or not _launcher.alive:
        _launcher = _Launcher(fork=fork and _can_fork())
    return _launcher


def start_launcher(*, fork: bool = False) -> None:
    """Start the launcher now; later stage starts are cheap.

    By default it is a fresh interpreter that imports vLLM in parallel with
    the caller. ``fork=True`` is for a process that owns its main module and
    has imported vLLM already (``vllm-omni serve``): the launcher is then a
    fork of it, made while it is still single-threaded, and imports nothing.
    """
    with _lock:
        _current(fork=fork)


def hold() -> None:
    """Keep the launcher running for the life of this process."""
    global _held
    with _lock:
        _held = True
        _current()


def acquire() -> Lease:
    """Lease the shared launcher; the last release closes it."""
    global _users
    with _lock:
        _users += 1
        return Lease(_current())


def _release(launcher: _Launcher) -> None:
    global _users, _launcher
    with _lock:
        _users -= 1
        closing = _users == 0 and not _held and launcher is _launcher
        if closing:
            _launcher = None
    if closing or not launcher.alive:
        launcher.close()
