"""The package's version (the one in ``pyproject.toml``), importable without
the package's lazy attributes: what the stage wire's handshake, the trace
resource and ``vllm_omni.__version__`` report."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.31.0.dev0"
