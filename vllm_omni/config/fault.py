"""A fault drill: a stage that misbehaves when a prompt carries its marker.

The keys of ``faults[N]`` (docs/errors/stages.md, "Faults (drills and
tests)"). The engine's ``faults`` reads this, never the other way: which
exception class a file may name is part of the schema, so it is resolved
here, importing the class's module (and so vLLM) only when asked.
"""

from __future__ import annotations

import builtins
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["FAULT_EXCEPTION_MODULES", "FaultAction", "FaultConfig", "resolve_exception"]

FaultAction = Literal["raise", "exit", "hang"]
"""``raise`` an exception, ``exit`` the stage's process, ``hang`` past its deadline."""

# Only modules that own error types, so a pipeline file cannot name
# arbitrary code.
FAULT_EXCEPTION_MODULES = (
    "builtins",
    "asyncio.exceptions",
    "vllm.exceptions",
    "vllm.v1.engine.exceptions",
    "vllm_omni.errors",
    "vllm_omni.errors.types",
)
"""The modules a ``raise`` fault may take its exception class from."""


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """A drill: when a prompt contains ``marker``, stage ``stage`` misbehaves."""

    stage: int
    """The id of the stage that misbehaves (a file may give its name)."""
    marker: str
    """The text a prompt contains to set the fault off."""
    action: FaultAction
    """What the stage does then."""
    exception: str | None = None
    """For ``raise``: ``"module:QualName"`` of the exception class; None:
    ``RuntimeError``."""
    args: tuple[Any, ...] = ()
    """Positional arguments of the exception."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the exception."""

    def build_exception(self) -> BaseException:
        """The exception a ``raise`` fault throws (a ``RuntimeError`` unless
        it names one)."""
        if self.exception is None:
            return RuntimeError(f"injected fault {self.marker!r}")
        return resolve_exception(self.exception)(*self.args, **dict(self.kwargs))


def resolve_exception(name: str) -> type[BaseException]:
    """The exception class ``"module:Name"`` (or a bare name) stands for;
    ``LookupError`` unless it is one from the modules that own error types
    (imported here, on first use: they import vLLM)."""
    module_name, _, attr = name.rpartition(":")
    candidates = [module_name] if module_name else ["vllm_omni.errors", "builtins"]
    for candidate in candidates:
        if candidate not in FAULT_EXCEPTION_MODULES:
            break
        module = (
            builtins if candidate == "builtins" else importlib.import_module(candidate)
        )
        value = getattr(module, attr, None)
        if isinstance(value, type) and issubclass(value, BaseException):
            return value
    raise LookupError(
        f"{name!r} is not an exception class of {', '.join(FAULT_EXCEPTION_MODULES)}"
    )
