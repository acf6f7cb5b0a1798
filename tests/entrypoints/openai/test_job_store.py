"""The job store belongs to one server at a time, and keeps a finished job
until it is deleted or, with a retention, until it expires."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from vllm_omni.entrypoints.openai.jobs import Job, JobStore, VideoJobs


def test_second_server_on_the_same_store_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "jobs.sqlite3")
    first = JobStore(path)
    with pytest.raises(RuntimeError, match="in use by another vllm-omni server"):
        JobStore(path)
    first.close()
    second = JobStore(path)  # released on close
    second.close()


def _job(job_id: str) -> Job:
    return Job(
        id=job_id,
        status="queued",
        created_at=int(time.time()),
        completed_at=None,
        model="m",
        prompt="p",
        params={},
        seconds=None,
        size=None,
        progress=0,
        error=None,
        error_category=None,
    )


def _finished_at(store: JobStore, job_id: str, at: float) -> None:
    """``job_id`` completed at ``at`` (a time in the past)."""
    store.create(_job(job_id))
    assert store.complete(job_id, b"GIF", seconds=None, size=None)
    store._write(
        "UPDATE video_jobs SET completed_at = ? WHERE id = ?", (int(at), job_id)
    )


def test_retention_expires_finished_jobs_only(tmp_path: Path) -> None:
    """A finished job kept past the retention reads as deleted at once, and
    ``expire`` gives its row back; unfinished and younger jobs stay."""
    store = JobStore(str(tmp_path / "jobs.sqlite3"), retention_s=60)
    now = time.time()
    _finished_at(store, "old", now - 61)
    _finished_at(store, "young", now - 30)
    store.create(_job("running"))
    assert store.start("running")

    assert store.get("old") is None and store.content("old") is None
    assert not store.delete_finished("old")
    young = store.get("young")
    assert young is not None and young.to_api(60)["expires_at"] == int(now - 30) + 60
    page = store.list(limit=10, after=None, newest_first=True)
    assert page is not None and [j.id for j in page[0]] == ["running", "young"]
    assert store.list(limit=10, after="old", newest_first=True) is None

    assert store.expire() == 1
    remaining = store._db.execute("SELECT id FROM video_jobs ORDER BY seq").fetchall()
    assert [r[0] for r in remaining] == ["young", "running"]
    assert store.expire() == 0
    store.close()


def test_without_retention_nothing_expires(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "jobs.sqlite3"))
    _finished_at(store, "old", 1.0)
    job = store.get("old")
    assert job is not None and job.to_api()["expires_at"] is None
    assert store.expire() == 0 and store.get("old") is not None
    store.close()


async def test_the_sweep_runs_at_start(tmp_path: Path) -> None:
    """A restarted server gives back the disk of jobs that expired while it
    was down, before it serves."""
    path = str(tmp_path / "jobs.sqlite3")
    store = JobStore(path)
    _finished_at(store, "old", time.time() - 120)
    store.close()
    jobs = await VideoJobs.start(path, None, retention_s=60)  # type: ignore[arg-type]
    try:
        for _ in range(100):
            with jobs._store._lock:
                count = jobs._store._db.execute(
                    "SELECT COUNT(*) FROM video_jobs"
                ).fetchone()[0]
            if count == 0:
                break
            await asyncio.sleep(0.02)
        assert count == 0
    finally:
        await jobs.shutdown()
