"""The Ray failure table in docs/errors/stages.md is the one in the code."""

from __future__ import annotations

from pathlib import Path

from vllm_omni.engine.ray_backend import RAY_FAILURES, describe_exit

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors" / "stages.md"


def _rows() -> dict[str, list[str]]:
    section = DOC.read_text().split("### Ray failures", 1)[1]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0].strip("`")] = cells
    return rows


def test_every_ray_failure_is_documented_with_its_reason() -> None:
    rows = _rows()
    for name, reason in RAY_FAILURES.items():
        assert rows[name][-1] == reason, name
        assert rows[name][2:4] == ["500, fatal", "server"]
    documented = {name for name, cells in rows.items() if cells[2] == "500, fatal"} - {
        "the worker returned by itself"
    }
    assert documented == set(RAY_FAILURES)


def test_orphaned_worker_reason_is_documented() -> None:
    assert _rows()["the worker returned by itself"][-1] == describe_exit(None, 0)
