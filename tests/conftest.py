"""Pytest setup shared by every test package.

The partition drills and the test hosts are helper modules, not test
modules: their asserts are registered for pytest's rewriting so that a
failing check shows the values it compared.
"""

from __future__ import annotations

import os

import pytest

# Ray binds a node to this host's public address unless told it is not a
# cluster, and reads the flag when it is first imported: by any test module
# that imports vLLM's engine (``vllm.v1.engine.async_llm`` imports Ray), so
# before every test package is collected, not only tests/ray. Nothing here
# leaves 127.0.0.1; token auth would write a token under ~/.ray.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

pytest.register_assert_rewrite("tests.netns", "tests.partition_drills")
