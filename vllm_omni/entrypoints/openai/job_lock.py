"""Exclusive ownership of a job store file, claimable before anything heavy.

Owns the ``flock`` on ``<job store>.lock``. ``vllm-omni serve`` claims it
first thing (before importing vLLM), so a store held by another server fails
in milliseconds; ``JobStore`` then takes over the lock this process already
holds instead of claiming it again. Stdlib only: this module must stay cheap
to import.
"""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path
from typing import IO

__all__ = ["JobStoreInUseError", "claim"]

_lock = threading.Lock()
# Locks this process claimed ahead of its JobStore, by resolved lock path.
_claimed: dict[Path, IO[bytes]] = {}


class JobStoreInUseError(RuntimeError):
    """Another live process owns the job store."""


def claim(store_path: str | Path, *, ahead: bool = False) -> IO[bytes]:
    """Own the store exclusively for this process's life.

    At startup a server fails the jobs a previous process left unfinished; a
    second live server on the same file would fail the first one's running
    jobs, so it refuses to start instead. ``ahead=True`` keeps the claim for
    the ``JobStore`` this process opens later (which gets the same handle;
    closing it releases the lock).
    """
    store = Path(store_path)
    lock_path = Path(f"{store}.lock").resolve()
    with _lock:
        held = _claimed.pop(lock_path, None)
        if held is not None and not held.closed:
            if ahead:
                _claimed[lock_path] = held
            return held
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        handle = lock_path.open("a+b")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise JobStoreInUseError(
                f"the job store {store} is in use by another vllm-omni server; "
                "give each server its own --job-store"
            ) from None
        if ahead:
            _claimed[lock_path] = handle
        return handle
