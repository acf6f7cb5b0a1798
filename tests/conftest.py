"""Pytest setup shared by every test package.

The partition drills and the test hosts are helper modules, not test
modules: their asserts are registered for pytest's rewriting so that a
failing check shows the values it compared.
"""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("tests.netns", "tests.partition_drills")
