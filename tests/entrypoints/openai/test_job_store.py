"""The job store belongs to one server at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni.entrypoints.openai.jobs import JobStore


def test_second_server_on_the_same_store_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "jobs.sqlite3")
    first = JobStore(path)
    with pytest.raises(RuntimeError, match="in use by another vllm-omni server"):
        JobStore(path)
    first.close()
    second = JobStore(path)  # released on close
    second.close()
