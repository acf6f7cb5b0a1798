"""The engine's requests in flight, readable by every API server process.

One machine word in an anonymous shared mapping, made before the API server
processes are forked (they inherit it): the engine process writes the
number its request table holds whenever it changes, an API server process
reads it when it asks admission before a body (no round trip, no lock; a
stale read only lets a request on to the engine's own check).
"""

from __future__ import annotations

import mmap
import struct

__all__ = ["AdmissionBoard"]

_WORD = struct.Struct("<q")


class AdmissionBoard:
    """A shared counter: one writer (the engine), any number of readers."""

    def __init__(self) -> None:
        # Anonymous and MAP_SHARED (mmap's default): a fork shares the page.
        self._map = mmap.mmap(-1, _WORD.size)

    def set(self, in_flight: int) -> None:
        _WORD.pack_into(self._map, 0, in_flight)

    def get(self) -> int:
        value: int = _WORD.unpack_from(self._map, 0)[0]
        return value
