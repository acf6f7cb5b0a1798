"""How stage processes are made: one preloaded forkserver, cheap forks.

Importing vLLM (and with it torch) costs several seconds per process, and
every stage process needs vLLM's exception classes to normalize errors. So
stage processes come from a multiprocessing "forkserver" whose preload list
holds the stage worker module: the forkserver imports vLLM once, and each
stage is a fork of it that starts in milliseconds. The parent never forks
itself (it may have threads and an event loop), and the forkserver is shared
by every engine in the process.

This module is cheap to import (it does not import vLLM), so an entrypoint
can call ``start_forkserver()`` early and overlap the forkserver's imports
with its own.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
from multiprocessing.context import ForkServerContext

__all__ = ["WORKER_MODULE", "mp_context", "start_forkserver"]

WORKER_MODULE = "vllm_omni.engine.stage_worker"
# "__main__" as multiprocessing preloads by default: a child then does not
# re-run the parent's main script (e.g. the pytest or vllm-omni entry point).
_PRELOAD = ["__main__", WORKER_MODULE]


def mp_context() -> ForkServerContext:
    """The forkserver context, with the stage worker module preloaded."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context  # type: ignore[return-value]


def start_forkserver() -> None:
    """Start the forkserver now (it imports vLLM); later forks are cheap."""
    mp_context()
    multiprocessing.forkserver.ensure_running()
