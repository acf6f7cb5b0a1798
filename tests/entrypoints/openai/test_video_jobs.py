"""A video job is independent of the request that created it (§9): neither
that request's client going away nor its cancellation aborts or loses the
job, and the job's own abort is counted with its own reason.

A real engine (a video stage whose ``@hang`` prompt holds until aborted) and
a real SQLite job store; the creating request is played by a task with the
abort context the HTTP boundary gives every request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.prom import local
from vllm_omni.config import pipeline_from_mapping
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.entrypoints.openai.jobs import Job, VideoJobs
from vllm_omni.errors.metrics import AbortContext, record_abort, set_abort_context

pytestmark = pytest.mark.timeout(120)

PIPELINE = {
    "model": "omni-jobs",
    "stages": [{"id": 0, "name": "video", "kind": "video", "timeout_s": 60}],
    "faults": [{"stage": 0, "marker": "@hang", "action": "hang"}],
}
REASONS = ("client_disconnect", "cancelled", "abort", "timeout")


@pytest_asyncio.fixture
async def jobs(tmp_path: Path) -> AsyncIterator[tuple[AsyncOmni, VideoJobs]]:
    engine = await AsyncOmni.create(pipeline=pipeline_from_mapping(PIPELINE))
    video_jobs = await VideoJobs.start(str(tmp_path / "jobs.sqlite3"), engine)
    yield engine, video_jobs
    await video_jobs.shutdown()
    engine.shutdown()


def _aborts() -> dict[str, float]:
    return {r: local("vllm_omni:aborts_total", reason=r) for r in REASONS}


async def _status(video_jobs: VideoJobs, job_id: str, *wanted: str) -> Job:
    async with asyncio.timeout(30):
        while True:
            job = await video_jobs.get(job_id)
            assert job is not None
            if job.status in wanted:
                return job
            await asyncio.sleep(0.05)


async def _running(engine: AsyncOmni, job_id: str) -> None:
    async with asyncio.timeout(30):
        while job_id not in ((await engine.stage_stats())[0] or {}).get("active", []):
            await asyncio.sleep(0.05)


async def test_the_creators_disconnect_neither_aborts_nor_relabels_the_job(
    jobs: tuple[AsyncOmni, VideoJobs],
) -> None:
    engine, video_jobs = jobs

    async def create_then_hang_up() -> Job:
        context = AbortContext()
        set_abort_context(context)
        job = await video_jobs.submit(
            prompt="a fox @hang", params={}, seconds=None, size=None
        )
        # The client goes away: the boundary marks and counts it (its 499).
        context.reason = "client_disconnect"
        record_abort("client_disconnect")
        return job

    job = await asyncio.create_task(create_then_hang_up())
    await _running(engine, job.id)
    before = _aborts()
    await asyncio.sleep(0.5)
    assert (await _status(video_jobs, job.id, "in_progress")).status == "in_progress"
    # Cancelled later (DELETE): one abort, the job's own, not the creator's.
    assert await video_jobs.cancel(job.id)
    after = _aborts()
    assert {r: after[r] - before[r] for r in REASONS} == {
        "client_disconnect": 0,
        "cancelled": 1,
        "abort": 0,
        "timeout": 0,
    }
    assert (await _status(video_jobs, job.id, "cancelled")).status == "cancelled"


async def test_a_job_whose_creator_is_cancelled_mid_submit_still_runs(
    jobs: tuple[AsyncOmni, VideoJobs],
) -> None:
    _, video_jobs = jobs
    creating = asyncio.create_task(
        video_jobs.submit(
            prompt="a fox", params={"seconds": 0.2}, seconds=None, size=None
        )
    )
    await asyncio.sleep(0)  # the record is being written (in a thread)
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    async with asyncio.timeout(10):
        while not (
            page := await video_jobs.list(limit=10, after=None, newest_first=True)
        )[0]:
            await asyncio.sleep(0.05)
    assert page is not None
    (job,), _ = page
    # Accepted means run: completed, not left queued until a restart.
    assert (
        await _status(video_jobs, job.id, "completed", "failed")
    ).status == "completed"
