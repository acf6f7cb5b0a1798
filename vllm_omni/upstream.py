"""The upstream vLLM modules the control plane imports, at their real cost.

Two upstream imports used to cost a server 3–4 s each beyond ``import vllm``
although neither needs what it loads:

- ``vllm.v1.engine.exceptions`` (``EngineDeadError``, ``EngineGenerateError``)
  is a leaf module whose only import is ``vllm.exceptions``; importing it the
  usual way first runs its package, ``vllm/v1/engine/__init__.py``, which
  loads ``vllm.config``, transformers and ``torch._dynamo``.
  ``engine_exceptions()`` loads the leaf alone, from upstream's own file,
  under its own name: every later ``from vllm.v1.engine.exceptions import
  ...`` (upstream's ``AsyncLLM`` included) finds it in ``sys.modules`` and
  gets the same classes, so ``except EngineDeadError`` and ``isinstance``
  hold across both paths, and the package, imported later (a stage running
  the real engine), gets the module as its attribute. When the package is
  already imported, the usual import is used. The one form that needs the
  package first is ``import vllm.v1.engine.exceptions as m``; upstream and
  this project use ``from ... import`` (pinned by a test).
- ``vllm.entrypoints.launchers.launcher`` (``NoSignalServer``,
  ``terminate_if_errored``) imports ``vllm.engine.protocol`` and so
  ``vllm.config``. ``launcher()`` imports it on first use; the error boundary
  warms it in a thread when the app starts (``warm_launcher``), so
  ``/health`` does not wait for it, and ``terminate_if_errored`` applies
  upstream's rule without blocking the event loop if it is still loading.

This module owns only how those modules are imported; the classes and the
rules are upstream's, used as they are.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

__all__ = ["engine_exceptions", "launcher", "terminate_if_errored", "warm_launcher"]

_ENGINE_EXCEPTIONS = "vllm.v1.engine.exceptions"
_ENGINE_PACKAGE = "vllm.v1.engine"
_LAUNCHER = "vllm.entrypoints.launchers.launcher"
_lock = threading.Lock()
# Set once the launcher module is fully imported (sys.modules also holds a
# module another thread is still importing).
_launcher: ModuleType | None = None


def engine_exceptions() -> ModuleType:
    """``vllm.v1.engine.exceptions``, without running its package's import."""
    with _lock:
        loaded = sys.modules.get(_ENGINE_EXCEPTIONS)
        if loaded is not None:
            return loaded
        if _ENGINE_PACKAGE in sys.modules:
            return importlib.import_module(_ENGINE_EXCEPTIONS)
        locations = getattr(importlib.import_module("vllm.v1"), "__path__", None)
        if not locations:
            return importlib.import_module(_ENGINE_EXCEPTIONS)
        leaf = importlib.util.spec_from_file_location(
            _ENGINE_EXCEPTIONS, f"{locations[0]}/engine/exceptions.py"
        )
        if leaf is None or leaf.loader is None:
            return importlib.import_module(_ENGINE_EXCEPTIONS)
        module = importlib.util.module_from_spec(leaf)
        sys.modules[_ENGINE_EXCEPTIONS] = module
        try:
            leaf.loader.exec_module(module)
        except BaseException:
            del sys.modules[_ENGINE_EXCEPTIONS]
            raise
        sys.meta_path.insert(0, _AttachToPackage())
        return module


class _AttachToPackage:
    """Sets ``vllm.v1.engine.exceptions`` on its package once the package is
    imported, as a usual import would have (``vllm.v1.engine.exceptions.X``
    attribute chains keep working). A meta path finder that finds nothing
    itself: it only wraps the package's own loader."""

    def find_spec(self, name: str, path: object, target: object = None) -> object:
        if name != _ENGINE_PACKAGE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            module.exceptions = sys.modules[_ENGINE_EXCEPTIONS]  # type: ignore[attr-defined]

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def launcher() -> ModuleType:
    """``vllm.entrypoints.launchers.launcher``, imported on first use."""
    global _launcher
    module = importlib.import_module(_LAUNCHER)
    _launcher = module
    return module


def warm_launcher() -> threading.Thread:
    """Import ``launcher()`` in a daemon thread (for a server starting up)."""
    thread = threading.Thread(target=launcher, name="vllm-omni-warm", daemon=True)
    thread.start()
    return thread


def terminate_if_errored(server: Any, engine: Any) -> None:
    """Upstream's ``terminate_if_errored`` rule, never blocking the caller.

    Called on the event loop when a request sees the engine die: when the
    launcher module is not fully imported yet, a thread imports it and then
    applies the rule (uvicorn polls ``should_exit``), so the request's
    response goes out meanwhile.
    """
    if _launcher is not None:
        _launcher.terminate_if_errored(server=server, engine=engine)
        return

    def load_then_apply() -> None:
        launcher().terminate_if_errored(server=server, engine=engine)

    threading.Thread(target=load_then_apply, name="vllm-omni-rule", daemon=True).start()
