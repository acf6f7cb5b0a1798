"""Holding the real engine still, so drills act mid-generation.

The tiny model decodes a whole response in tens of milliseconds, before a
client can act on its first chunk (a kill or a hang-up then lands after the
end, and the drill tests nothing). ``EnginePause`` stops the process that runs
the model (``SIGSTOP``: the EngineCore's ``VLLM::Worker``, or the EngineCore
itself without one) and lets it run in short steps until the client holds its
first chunk: from then on the model is stopped with most of the response
still to generate, whatever the load of the machine, because each step lets
it run for a moment only. The EngineCore itself keeps
running, so the outputs it already has reach the client (stopping it too
left them stuck in its output thread while the steps went on).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from types import TracebackType
from typing import Any

import httpx
import psutil

from tests.e2e.omni_server import OmniServer

_WAIT_S = 0.05
_DEADLINE_S = 60.0


def warm_up(server: OmniServer) -> None:
    """One short stream through the whole path first: the first request's
    one-time costs (imports, templates, detokenizer) would otherwise delay
    the first chunk while the steps go on."""
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


def engine_core_pid(server: OmniServer) -> int:
    for child in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            if (
                "EngineCore" in " ".join(child.cmdline())
                or "EngineCore" in child.name()
            ):
                return child.pid
        except psutil.NoSuchProcess:
            continue
    raise AssertionError("no EngineCore process under the server")


class EnginePause:
    """Stops the model's process on enter and lets it go on exit
    (``SIGCONT``); the EngineCore (``pid``) is for the drill to kill."""

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

    def step(self) -> None:
        """Let the model run for a moment: ``SIGSTOP`` follows ``SIGCONT`` at
        once. A sleep between them grows to tens of milliseconds when this
        process waits for a core, and the tiny model finishes a response in
        that time."""
        self.resume()
        self.stop()

    def until(self, event: threading.Event) -> None:
        """Run the engine in steps until ``event`` is set; the engine is
        stopped when this returns."""
        deadline = time.monotonic() + _DEADLINE_S
        while not event.is_set():
            assert time.monotonic() < deadline, "the engine made no progress"
            self.step()
            event.wait(_WAIT_S)

    def __enter__(self) -> EnginePause:
        self.stop()
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
                "POST", self.url, json=self.body, timeout=120
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
