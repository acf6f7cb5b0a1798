"""Fault injection for drills and tests: make a stage raise, exit or hang.

Runs in the stage's process before the stage sees the request
(docs/runtime.md §9). Which exception a ``raise`` fault builds is
``vllm_omni.config``'s business: this module depends on it, never the reverse.
"""

from __future__ import annotations

import asyncio
import os

from vllm_omni.config import FaultConfig

__all__ = ["HANG_SECONDS", "apply_fault", "matching_fault"]

HANG_SECONDS = 3600.0


def matching_fault(faults: tuple[FaultConfig, ...], prompt: str) -> FaultConfig | None:
    """The first fault whose marker occurs in ``prompt``."""
    return next((fault for fault in faults if fault.marker in prompt), None)


async def apply_fault(fault: FaultConfig) -> None:
    """Misbehave as ``fault`` says; returns only if a hang is never preempted."""
    if fault.action == "exit":
        os._exit(1)
    if fault.action == "hang":
        await asyncio.sleep(HANG_SECONDS)
        return
    raise fault.build_exception()
