"""vLLM-Omni: multi-stage, multi-modal serving on top of vLLM.

Importing this package is cheap on purpose: nothing here imports vLLM or torch,
so command-line tools such as ``vllm-omni errors audit`` start in well under a
second. Heavy modules are loaded on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.31.0.dev0"

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
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value
