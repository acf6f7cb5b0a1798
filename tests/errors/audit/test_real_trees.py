"""The inventory on the published vllm-omni 0.30.0 wheel is pinned.

``audit_fixtures/wheel-0.30.0-inventory.json`` holds the raise sites by
exception and top-level folder that the audit reported on the wheel before
issue 16 (which an independent ``ast.walk`` census matched), with variables
folded into one row; the prefilter, the walker and the rule fixes must not
move one. The wheel is downloaded once with pip (``benchmarks.bench_audit``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.bench_audit import wheel_tree
from vllm_omni.errors.audit.runner import run_audit

from .conftest import FIXTURES

PINNED = json.loads((FIXTURES / "wheel-0.30.0-inventory.json").read_text())


@pytest.fixture(scope="module")
def wheel() -> Path:
    try:
        return wheel_tree()
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"the vllm-omni 0.30.0 wheel cannot be downloaded here: {exc}")


def test_the_wheel_inventory_is_pinned(wheel: Path) -> None:
    report = run_audit([str(wheel)], jobs=2, cache=None)
    inventory = {name: dict(by_folder) for name, by_folder in report.inventory.items()}
    assert report.files == PINNED["files"] == 1609
    assert sum(map(sum, (c.values() for c in report.inventory.values()))) == 7571
    assert inventory == PINNED["inventory"]
