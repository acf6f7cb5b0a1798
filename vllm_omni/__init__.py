"""vLLM-Omni: multi-stage, multi-modal serving on top of vLLM.

Importing this package is cheap on purpose: nothing here imports vLLM or torch,
so command-line tools such as ``vllm-omni errors audit`` start in well under a
second. Heavy modules are loaded on first attribute access; the first access
to ``Omni`` or ``AsyncOmni`` also starts the stage launcher (see
``vllm_omni.engine.processes``), so its vLLM import overlaps the caller's.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from vllm_omni.version import __version__

_LAZY_ATTRS = {
    "Omni": "vllm_omni.entrypoints.omni:Omni",
    "AsyncOmni": "vllm_omni.entrypoints.async_omni:AsyncOmni",
}

if TYPE_CHECKING:
    from vllm_omni.entrypoints.async_omni import AsyncOmni
    from vllm_omni.entrypoints.omni import Omni

__all__ = ["AsyncOmni", "Omni", "__version__"]


def __getattr__(name: str) -> Any:
    target = _LAZY_ATTRS.get(name)
    if target is None:
        raise AttributeError(f"module 'vllm_omni' has no attribute {name!r}")
    module_name, attr = target.split(":")
    if module_name not in sys.modules:
        # An engine is about to be made: start the stage launcher's vLLM
        # import now, overlapped with this process's own.
        from vllm_omni.engine.processes import start_launcher

        start_launcher()
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value
