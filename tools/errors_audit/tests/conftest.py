"""Fixtures of the audit's tests: the command line in a subprocess, its JSON.

Paths and helpers that test modules import are in ``audit_testing``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from audit_testing import REPO, RunCli, cli_command


@pytest.fixture
def run_cli(tmp_path: Path) -> RunCli:
    """Run the audit in a subprocess from the repo root, with a private cache."""

    def run(
        *args: str, command: Sequence[str] | None = None, cwd: Path = REPO
    ) -> subprocess.CompletedProcess[str]:
        argv = [*(command or cli_command()), *args, "--cache-dir", str(tmp_path / "c")]
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)

    return run


@pytest.fixture
def audit_json(run_cli: RunCli) -> Callable[..., dict[str, object]]:
    def run(*args: str) -> dict[str, object]:
        done = run_cli(*args, "--format", "json")
        assert done.returncode in (0, 1), done.stderr
        return json.loads(done.stdout)

    return run
