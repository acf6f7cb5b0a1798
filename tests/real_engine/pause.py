"""Holding the real engine still, so drills act mid-generation.

What was seen on a 2-core machine: while the engine generates, a stream's
chunks can reach the client in bursts seconds apart (the EngineCore and its
``VLLM::Worker`` wait for each other by spinning and take both cores), so a
client's first chunk can arrive when most of the response is already
generated; a CI run got the first chunk of a 4,000-token response together
with its last. A drill therefore never waits on the client to decide when to
stop the model. ``EnginePause.until`` waits for the engine's own log line
that it took the request (``enable_log_requests``), lets the model run for a
moment (a first token takes milliseconds), then stops the model's process
(``SIGSTOP``: the EngineCore's ``VLLM::Worker``, or the EngineCore itself
without one) and waits, stopped, for the client's first chunk; only if none
comes does it let the model run another moment. The EngineCore keeps
running, so the outputs it already has reach the client. The drills ask for
responses of tens of thousands of tokens (``LONG_MODEL_LEN``, over a minute
of generation here), so even a stop that comes seconds late lands
mid-stream. (Lowering the engine's priority to nice 19 did not remove the
bursts, so it is not done.)
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
import uuid
from types import TracebackType
from typing import Any

import httpx
import psutil

from tests.e2e.omni_server import SERVER_MARK, OmniServer

_DEADLINE_S = 60.0
# How long the model runs before it is stopped, and how long the stopped
# engine's first outputs may take to reach the client before it runs again.
_RUN_S = 0.3
_FIRST_CHUNK_S = 10.0


def warm_up(server: OmniServer) -> None:
    """One short stream through the whole path first: the first request's
    one-time costs (imports, templates, detokenizer) would otherwise delay
    the first chunk of the drill's stream."""
    stream = Stream(
        server.base_url + "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "max_tokens": 2,
        },
    )
    stream.run()
    assert (stream.status, stream.error) == (200, None), stream.error


# How long the server's processes are searched for its EngineCore.
_FIND_ENGINE_S = 10.0


def engine_core_pid(server: OmniServer) -> int:
    """The server's EngineCore: looked for under the server's process tree,
    then (twice in CI, on the Ray server, a walk of the tree did not find an
    EngineCore that was running and answering) among every process that
    carries the server's mark in its environment (``SERVER_MARK``)."""
    deadline = time.monotonic() + _FIND_ENGINE_S
    while True:
        pid = _engine_core_under(server.proc.pid)
        if pid is None:
            pid = engine_core_marked(str(server.log_path))
        if pid is not None:
            return pid
        if time.monotonic() > deadline:
            raise AssertionError(
                "no EngineCore process under the server or with its mark; "
                f"server {server.proc.pid}, engine processes: {_engine_cores()}"
            )
        time.sleep(0.2)


def _is_engine_core(process: psutil.Process) -> bool:
    # The title is VLLM::EngineCore; the kernel's name keeps 15 characters
    # of it (VLLM::EngineCor).
    return "EngineCor" in process.name() or "EngineCore" in " ".join(process.cmdline())


def _engine_core_under(pid: int) -> int | None:
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if _is_engine_core(child):
                return child.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def engine_core_marked(mark: str) -> int | None:
    """An EngineCore that carries ``mark``, or one of whose parents does: a
    process that sets its title (``VLLM::EngineCore``, ``ray::…``) overwrites
    the memory its environment is read from, the raylet does not."""
    for process in psutil.process_iter():
        try:
            if _is_engine_core(process) and any(
                _mark_of(p) == mark for p in (process, *process.parents())
            ):
                return process.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return None


def _engine_cores() -> list[str]:
    """Every EngineCore on the machine with its chain of parents (pid, name,
    the mark it carries), for the message of a lookup that failed."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if _is_engine_core(process):
                found.append(
                    " <- ".join(
                        f"{p.pid}:{p.name()}:{_mark_of(p)}"
                        for p in (process, *process.parents())
                    )
                )
    return found


def _mark_of(process: psutil.Process) -> str:
    try:
        return process.environ().get(SERVER_MARK, "-")
    except psutil.Error:
        return "?"


class EnginePause:
    """From ``until`` on, stops the model's process; ``__exit__`` lets it go
    on (``SIGCONT``). ``pid`` is the EngineCore, for the drill to kill."""

    def __init__(self, server: OmniServer) -> None:
        self.pid = engine_core_pid(server)
        workers = [
            child.pid
            for child in psutil.Process(self.pid).children()
            if "Worker" in child.name()
        ]
        self.held = workers or [self.pid]

    def _signal(self, signum: int) -> None:
        for pid in self.held:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def stop(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def until(self, server: OmniServer, stream: Stream) -> None:
        """Stop the model once the engine has ``stream``'s request and the
        client holds a first chunk; the model is stopped when this returns."""
        added = re.compile(rf"Added request {re.escape(stream.request_id)}\b")
        deadline = time.monotonic() + _DEADLINE_S
        while not (stream.first.is_set() or added.search(server.log())):
            assert time.monotonic() < deadline, "the engine never got the request"
            time.sleep(0.05)
        while True:
            if not stream.first.is_set():
                time.sleep(_RUN_S)  # the first tokens
            self.stop()
            if stream.first.wait(_FIRST_CHUNK_S):
                return
            assert time.monotonic() < deadline, "no first chunk reached the client"
            self.resume()

    def __enter__(self) -> EnginePause:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.resume()


class Stream(threading.Thread):
    """A streaming chat completion read in a thread: ``events`` holds the
    data of each SSE event; ``first`` is set at the first one (or when the
    stream ended without any). With ``hang_up`` the client closes the
    connection right after the first event."""

    def __init__(self, url: str, body: dict[str, Any], *, hang_up: bool = False):
        super().__init__(daemon=True)
        # Sent as X-Request-Id: the engine's log names the request by it.
        self.request_id = uuid.uuid4().hex
        self.url = url
        self.body = body
        self.hang_up = hang_up
        self.status: int | None = None
        self.events: list[str] = []
        self.error: BaseException | None = None
        self.first = threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream(
                "POST",
                self.url,
                json=self.body,
                headers={"X-Request-Id": self.request_id},
                timeout=120,
            ) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    self.events.append(line.removeprefix("data: "))
                    self.first.set()
                    if self.hang_up:
                        break
        except BaseException as exc:  # read by the test thread
            self.error = exc
        finally:
            self.first.set()
