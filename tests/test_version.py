"""One version: the package's, the installed distribution's and
``pyproject.toml``'s agree (the stage wire's handshake compares it)."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import vllm_omni
from vllm_omni.version import __version__

ROOT = Path(__file__).resolve().parents[1]


def test_one_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert __version__ == vllm_omni.__version__ == project["version"]
    assert importlib.metadata.version("vllm-omni") == __version__
