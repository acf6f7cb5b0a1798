"""The engine's requests in flight, readable by every API server process.

Machine words in an anonymous shared mapping, made before the API server
processes are forked (they inherit it): the engine process writes the
number its request table holds whenever it changes, and each API server
process the number of places its routes hold for requests on their way to
the engine (``request_table.AdmissionHolds``); an API server process reads
their sum when it asks admission before a body (no round trip, no lock:
each word has one writer; a stale read only lets a request on to the
engine's own check).
"""

from __future__ import annotations

import mmap
import struct

__all__ = ["AdmissionBoard"]

_WORD = struct.Struct("<q")


class AdmissionBoard:
    """Shared counters: the engine's and one per API server process, each
    with one writer, any number of readers."""

    def __init__(self, api_servers: int = 1) -> None:
        self._words = struct.Struct(f"<{1 + api_servers}q")
        # Anonymous and MAP_SHARED (mmap's default): a fork shares the page.
        self._map = mmap.mmap(-1, self._words.size)

    def set(self, in_flight: int) -> None:
        """The engine's requests in flight (the engine process writes it)."""
        _WORD.pack_into(self._map, 0, in_flight)

    def hold(self, index: int, places: int) -> None:
        """The places API server process ``index`` holds (it alone writes it)."""
        _WORD.pack_into(self._map, _WORD.size * (1 + index), places)

    def get(self) -> int:
        """The requests in flight and the places held, over every process."""
        return sum(self._words.unpack_from(self._map, 0))
