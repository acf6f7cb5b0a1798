"""A ZMQ socket served straight from the event loop: no future per message.

Reads in a ``loop.add_reader`` callback and drains by the socket's ``EVENTS``,
since ZMQ's descriptor is edge-triggered (docs/runtime.md §7). It must not
know what the messages mean (``messages`` decodes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import zmq

__all__ = ["LoopSocket"]

logger = logging.getLogger(__name__)

# Plain ints: pyzmq turns its enum flags and options back into enums on
# every call (a Python call each, a few microseconds per socket operation).
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
_RCVMORE = int(zmq.RCVMORE)


class LoopSocket:
    """``socket`` read by ``loop``'s reader callback, written without waiting."""

    def __init__(
        self,
        socket: zmq.Socket[bytes],
        on_message: Callable[[list[bytes]], None],
    ) -> None:
        self.socket = socket
        self._on_message = on_message
        self._fd = socket.getsockopt(int(zmq.FD))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve the socket from ``loop`` (from its thread) from now on."""
        self._loop = loop
        loop.add_reader(self._fd, self._drain)
        self._check()  # whatever arrived before

    @property
    def closed(self) -> bool:
        return self.socket.closed

    def send_multipart(self, frames: list[bytes]) -> None:
        """Queue a message now; raises ``zmq.ZMQError`` if it cannot be."""
        try:
            for frame in frames[:-1]:
                self.socket.send(frame, _NOBLOCK | _SNDMORE)
            self.socket.send(frames[-1], _NOBLOCK)
        finally:
            self._check()  # a failed send may have taken the signal too

    def send(self, data: bytes) -> None:
        """Queue a one-frame message now; raises ``zmq.ZMQError`` if it cannot be."""
        try:
            self.socket.send(data, _NOBLOCK)
        finally:
            self._check()

    def _check(self) -> None:
        if self._pending or self._loop is None or self.socket.closed:
            return
        if self.socket.getsockopt(_EVENTS) & _POLLIN:
            self._pending = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._pending = False
        socket = self.socket
        while not socket.closed and socket.getsockopt(_EVENTS) & _POLLIN:
            try:
                frames = [socket.recv(_NOBLOCK)]
                while socket.getsockopt(_RCVMORE):
                    frames.append(socket.recv(_NOBLOCK))
            except zmq.Again:
                continue  # EVENTS decides, read again
            try:
                self._on_message(frames)
            except Exception:
                logger.exception("a message from the stage wire could not be handled")

    def close(self, linger: int = 0) -> None:
        """Stop serving and close the socket; idempotent."""
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(Exception):  # the loop is being torn down
                loop.remove_reader(self._fd)
        if not self.socket.closed:
            self.socket.close(linger=linger)
