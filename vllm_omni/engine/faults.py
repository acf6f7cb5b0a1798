"""Fault injection for drills and tests: make a stage raise, exit or hang.

Owns the three actions a pipeline's ``faults`` can request when a prompt
contains a fault's marker: ``raise`` (a ``RuntimeError``, or the named
exception class with the configured arguments), ``exit`` (``os._exit(1)``,
a crash that skips all cleanup) and ``hang`` (sleep far past any deadline,
preemptibly). It runs inside the stage process, before the stage sees the
request. Which exception a ``raise`` fault builds is the schema's business
(``FaultConfig.build_exception`` in ``vllm_omni.config``, which checks each
one at load time); this module only depends on that, never the reverse.
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
