"""Published vLLM releases' Python sources, read with ``ast``, never imported.

``vllm_tree("0.31.0")`` downloads the ``vllm==0.31.0`` wheel once with pip
(``--no-deps``) into the bench cache (``benchmarks.bench_audit.bench_cache``,
where the vllm-omni 0.30.0 wheel goes too), unpacks only its ``.py`` files
and deletes the wheel: a release the errors package runs on can be compared
without an environment of its own. Without a reachable index the caller
skips, saying why (``tree_or_skip``), unless its variable says the release
must be there.
"""

from __future__ import annotations

import os
import subprocess
from functools import cache
from pathlib import Path

import pytest

from benchmarks.bench_audit import bench_cache, unpacked_wheel

__all__ = ["tree_or_skip", "vllm_tree"]


def vllm_tree(version: str, cache_dir: Path | None = None) -> Path:
    """The ``vllm`` folder (its ``.py`` files) of the published wheel."""
    root = (cache_dir or bench_cache()) / "vllm-wheels"
    return unpacked_wheel(
        f"vllm=={version}", root / f"vllm-{version}" / "vllm", sources_only=True
    )


@cache
def _tree(version: str) -> Path | str:
    try:
        return vllm_tree(version)
    except (subprocess.CalledProcessError, OSError, ValueError) as exc:
        return f"the vllm {version} wheel cannot be downloaded here: {exc!r}"


def tree_or_skip(version: str, required: str) -> Path:
    """``vllm_tree(version)``; skips the test when it cannot be had, fails
    instead when the environment variable ``required`` is ``1``."""
    tree = _tree(version)
    if isinstance(tree, str):
        if os.environ.get(required) == "1":
            pytest.fail(tree)
        pytest.skip(tree)
    return tree
