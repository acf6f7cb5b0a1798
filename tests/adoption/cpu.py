"""What vllm-omni 0.30.0 needs to import and build its app on a CPU-only host.

Three facts of the index's builds, handled before anything of vLLM's
engine or vllm-omni is imported (``prepare`` is idempotent):

- torchvision is a CUDA build: its compiled ops need ``libtorch_cuda.so``.
  Its Python part registers fake kernels for ``torchvision::nms`` and
  ``torchvision::qnms`` at import, which needs their schemas; defining the
  two schemas with ``torch.library`` first lets it import (nothing here
  runs the ops);
- torchaudio, also a CUDA build, falls back to pure Python when its
  ``lib/*.so`` are absent (requirements/vllm-omni-030.sh removes them);
- torchcodec (a vLLM requirement) loads its compiled ops at import and
  fails with ``OSError`` when its libraries (FFmpeg's) cannot load; vLLM
  falls back when the import raises ``ImportError``, so torchcodec is then
  marked absent;
- vLLM finds no device here, so its platform is set to its CPU platform
  before its engine modules read ``current_platform``.
"""

from __future__ import annotations

import sys
from typing import Any

_library: list[Any] = []


def prepare() -> None:
    """Make torchvision importable and vLLM's platform the CPU one."""
    if _library:
        return
    import torch

    # Held for the life of the process: the schemas go when it is collected.
    library = torch.library.Library("torchvision", "DEF")
    library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _library.append(library)

    try:
        import torchcodec  # noqa: F401
    except OSError:
        for name in [n for n in sys.modules if n.split(".")[0] == "torchcodec"]:
            del sys.modules[name]
        sys.modules["torchcodec"] = None  # type: ignore[assignment]

    from vllm import platforms
    from vllm.platforms.cpu import CpuPlatform

    cpu = CpuPlatform()
    platforms._current_platform = cpu
    platforms.current_platform = cpu


def pytest_configure(config: object) -> None:
    """As a pytest plugin (``-p cpu``): prepare before any test module of
    vllm-omni's own tests is imported."""
    prepare()
