"""Upstream classes not every supported vLLM defines (``UPSTREAM_SINCE``),
for tests: the class where the installed vLLM has it, and a skip mark that
names what is missing where it does not."""

from __future__ import annotations

import pytest
import vllm

from vllm_omni.errors.types import UPSTREAM_SINCE, upstream_class

__all__ = ["lacks", "needs", "newer"]


def newer(name: str) -> type[BaseException] | None:
    """``vllm.exceptions.<name>`` or None (only names of ``UPSTREAM_SINCE``)."""
    return upstream_class(name)


def lacks(name: str) -> str:
    """Why a test of ``name`` cannot run on the installed vLLM."""
    return (
        f"vLLM {vllm.__version__} has no vllm.exceptions.{name} "
        f"(added in vLLM {UPSTREAM_SINCE[name]})"
    )


def needs(*names: str) -> pytest.MarkDecorator:
    """Skip unless the installed vLLM defines every one of ``names``."""
    missing = [name for name in names if newer(name) is None]
    return pytest.mark.skipif(bool(missing), reason="; ".join(map(lacks, missing)))
