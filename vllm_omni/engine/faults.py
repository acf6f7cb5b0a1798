"""Fault injection for drills and tests: make a stage raise, exit or hang.

Owns the three actions a pipeline's ``faults`` can request when a prompt
contains a fault's marker: ``raise`` (a ``RuntimeError``, or the named
exception class with the configured arguments), ``exit`` (``os._exit(1)``,
a crash that skips all cleanup) and ``hang`` (sleep far past any deadline,
preemptibly). Exception classes are resolved only from the modules that own
error types (builtins, ``asyncio.exceptions``, ``vllm.exceptions``,
``vllm.v1.engine.exceptions``, ``vllm_omni.errors``); this module never
imports anything else by name. It runs inside the stage process, before the
stage sees the request; ``vllm_omni.config`` also builds each ``raise``
fault's exception once at load time, so a bad entry is rejected with its key
path instead of failing as a 500.
"""

from __future__ import annotations

import asyncio
import builtins
import importlib
import os

from vllm_omni.config import FaultConfig

__all__ = [
    "HANG_SECONDS",
    "apply_fault",
    "build_exception",
    "matching_fault",
    "resolve_exception",
]

HANG_SECONDS = 3600.0
_EXCEPTION_MODULES = (
    "builtins",
    "asyncio.exceptions",
    "vllm.exceptions",
    "vllm.v1.engine.exceptions",
    "vllm_omni.errors",
    "vllm_omni.errors.types",
)


def matching_fault(faults: tuple[FaultConfig, ...], prompt: str) -> FaultConfig | None:
    """The first fault whose marker occurs in ``prompt``."""
    return next((fault for fault in faults if fault.marker in prompt), None)


def resolve_exception(name: str) -> type[BaseException]:
    """The exception class ``"module:Name"`` (or a bare name) stands for;
    ``LookupError`` unless it is one from the modules that own error types."""
    module_name, _, attr = name.rpartition(":")
    candidates = [module_name] if module_name else ["vllm_omni.errors", "builtins"]
    for candidate in candidates:
        if candidate not in _EXCEPTION_MODULES:
            break
        module = (
            builtins if candidate == "builtins" else importlib.import_module(candidate)
        )
        value = getattr(module, attr, None)
        if isinstance(value, type) and issubclass(value, BaseException):
            return value
    raise LookupError(
        f"{name!r} is not an exception class of {', '.join(_EXCEPTION_MODULES)}"
    )


def build_exception(fault: FaultConfig) -> BaseException:
    """The exception a ``raise`` fault throws."""
    if fault.exception is None:
        return RuntimeError(f"injected fault {fault.marker!r}")
    return resolve_exception(fault.exception)(*fault.args, **dict(fault.kwargs))


async def apply_fault(fault: FaultConfig) -> None:
    """Misbehave as ``fault`` says; returns only if a hang is never preempted."""
    if fault.action == "exit":
        os._exit(1)
    if fault.action == "hang":
        await asyncio.sleep(HANG_SECONDS)
        return
    raise build_exception(fault)
