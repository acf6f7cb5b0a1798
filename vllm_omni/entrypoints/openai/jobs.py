"""Async video jobs: a durable SQLite store and the workers that run the jobs.

Owns the job record and its life cycle (docs/runtime.md §15). It must not
build envelopes or HTTP statuses: a job's error is rendered by
``vllm_omni.errors.render.job_error``; the routes raise semantic exceptions
about the records they read from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, TypeVar

from vllm_omni.entrypoints.openai import job_lock
from vllm_omni.entrypoints.sampling_params_list import PARAMETER
from vllm_omni.errors import GenerationError, OmniServiceUnavailableError
from vllm_omni.errors.details import OmniErrorDetails
from vllm_omni.errors.http import details_for_exception
from vllm_omni.errors.metrics import AbortContext, set_abort_context
from vllm_omni.errors.normalizer import Mode
from vllm_omni.errors.render import job_error
from vllm_omni.tracing.hooks import job_span

if TYPE_CHECKING:
    from vllm_omni.entrypoints.async_omni import AsyncOmni

__all__ = [
    "FINISHED",
    "RESTART_MESSAGE",
    "Job",
    "JobStatus",
    "JobStore",
    "VideoJobs",
    "details_from_error_object",
    "new_job_id",
]

logger = logging.getLogger("vllm_omni.jobs")

JobStatus = Literal["queued", "in_progress", "completed", "failed", "cancelled"]
UNFINISHED: tuple[JobStatus, ...] = ("queued", "in_progress")
FINISHED: tuple[JobStatus, ...] = ("completed", "failed", "cancelled")
RESTART_MESSAGE = "The server restarted before the job finished; submit it again."
# Jobs generating at once; the rest wait as ``queued``.
MAX_RUNNING_JOBS = 4
# With a retention, expired jobs are deleted from the file this often.
SWEEP_S = 60.0

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS video_jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    completed_at INTEGER,
    model TEXT NOT NULL,
    prompt TEXT NOT NULL,
    params TEXT NOT NULL,
    seconds TEXT,
    size TEXT,
    progress INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    error_category TEXT,
    content BLOB
)
"""
# Everything but the content, which only a download reads.
_COLUMNS = (
    "id, status, created_at, completed_at, model, prompt, params, seconds, size, "
    "progress, error, error_category"
)
_UNFINISHED_SQL = "status IN ('queued', 'in_progress')"
_FINISHED_SQL = "status IN ('completed', 'failed', 'cancelled')"


def new_job_id() -> str:
    return f"video_{uuid.uuid4().hex}"


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Job:
    """One stored job, without its content."""

    id: str
    status: JobStatus
    created_at: int
    completed_at: int | None
    model: str
    prompt: str
    params: dict[str, Any]
    seconds: str | None
    size: str | None
    progress: int
    # The canonical error object (``render.job_error``) and its record's owner.
    error: dict[str, Any] | None
    error_category: Literal["client", "server"] | None

    @classmethod
    def _from_row(cls, row: tuple[Any, ...]) -> Job:
        (
            job_id,
            status,
            created_at,
            completed_at,
            model,
            prompt,
            params,
            seconds,
            size,
            progress,
            error,
            category,
        ) = row
        return cls(
            id=job_id,
            status=status,
            created_at=created_at,
            completed_at=completed_at,
            model=model,
            prompt=prompt,
            params=json.loads(params),
            seconds=seconds,
            size=size,
            progress=progress,
            error=None if error is None else json.loads(error),
            error_category=category,
        )

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def stored_error(self) -> OmniErrorDetails:
        """A failed job's stored error as a record (``details_from_error_object``);
        a row without one reads as the safe server-500 record."""
        return details_from_error_object(self.error or {}, self.error_category)

    def to_api(self, retention_s: int | None = None) -> dict[str, Any]:
        """The OpenAI ``Video`` object; ``error`` is the stored object,
        unchanged; ``expires_at`` when the store keeps finished jobs for
        ``retention_s`` seconds."""
        expires_at = (
            self.completed_at + retention_s
            if retention_s is not None and self.completed_at is not None
            else None
        )
        return {
            "id": self.id,
            "object": "video",
            "status": self.status,
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "expires_at": expires_at,
            "model": self.model,
            "progress": self.progress,
            "prompt": self.prompt,
            "seconds": self.seconds,
            "size": self.size,
            "remixed_from_video_id": None,
            "error": self.error,
        }


def details_from_error_object(
    obj: Mapping[str, Any], category: str | None
) -> OmniErrorDetails:
    """Rebuild the record a stored canonical error object was rendered from.

    ``category`` comes from its own column, never from the status. The read
    is tolerant (``OmniErrorDetails.from_wire``): a damaged row becomes a
    safe server-500 record instead of an exception. ``fatal`` is not kept:
    the engine that died was another request's, and maybe another process's.
    """
    return OmniErrorDetails.from_wire(
        {
            "message": obj.get("message"),
            "category": category,
            "status_code": obj.get("code"),
            "error_type": obj.get("type"),
            "parameter": obj.get("param"),
            "request_id": obj.get("request_id"),
            "stage_id": obj.get("stage_id"),
        }
    )


class JobStore:
    """The SQLite file. Methods are blocking and short; call them in a thread."""

    def __init__(self, path: str | None, retention_s: int | None = None) -> None:
        self.retention_s = retention_s
        target = ":memory:"
        self._owner: IO[bytes] | None = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            target = path
            self._owner = job_lock.claim(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(target, check_same_thread=False, timeout=10.0)
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
            self._db.commit()

    def _write(self, sql: str, args: tuple[Any, ...]) -> int:
        with self._lock:
            cursor = self._db.execute(sql, args)
            self._db.commit()
            return cursor.rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()
        if self._owner is not None:
            self._owner.close()  # releases the flock

    # -- reads: an expired job is not there ------------------------------------

    def _kept(self) -> tuple[str, tuple[Any, ...]]:
        """The condition (and its argument) of a job not yet expired."""
        if self.retention_s is None:
            return "1", ()
        return "(completed_at IS NULL OR completed_at > ?)", (
            time.time() - self.retention_s,
        )

    def get(self, job_id: str) -> Job | None:
        kept, args = self._kept()
        with self._lock:
            row = self._db.execute(
                f"SELECT {_COLUMNS} FROM video_jobs WHERE id = ? AND {kept}",
                (job_id, *args),
            ).fetchone()
        return None if row is None else Job._from_row(row)

    def list(
        self, *, limit: int, after: str | None, newest_first: bool
    ) -> tuple[list[Job], bool] | None:
        """A page of jobs and whether more follow; ``None`` if ``after`` is unknown."""
        op, order = ("<", "DESC") if newest_first else (">", "ASC")
        kept, kept_args = self._kept()
        with self._lock:
            where, args = f"WHERE {kept}", kept_args
            if after is not None:
                seq = self._db.execute(
                    f"SELECT seq FROM video_jobs WHERE id = ? AND {kept}",
                    (after, *kept_args),
                ).fetchone()
                if seq is None:
                    return None
                where, args = f"{where} AND seq {op} ?", (*kept_args, seq[0])
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM video_jobs {where} "
                f"ORDER BY seq {order} LIMIT ?",
                (*args, limit + 1),
            ).fetchall()
        return [Job._from_row(r) for r in rows[:limit]], len(rows) > limit

    def content(self, job_id: str) -> bytes | None:
        kept, args = self._kept()
        with self._lock:
            row = self._db.execute(
                f"SELECT content FROM video_jobs WHERE id = ? AND {kept}",
                (job_id, *args),
            ).fetchone()
        return None if row is None else row[0]

    def unfinished(self) -> list[str]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT id FROM video_jobs WHERE {_UNFINISHED_SQL} ORDER BY seq"
            ).fetchall()
        return [r[0] for r in rows]

    # -- writes (each guarded by the state it leaves, so races resolve once) ---

    def create(self, job: Job) -> None:
        self._write(
            "INSERT INTO video_jobs (id, status, created_at, model, prompt, params, "
            "seconds, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                job.id,
                job.status,
                job.created_at,
                job.model,
                job.prompt,
                _dumps(job.params),
                job.seconds,
                job.size,
            ),
        )

    def start(self, job_id: str) -> bool:
        return bool(
            self._write(
                "UPDATE video_jobs SET status = 'in_progress' "
                "WHERE id = ? AND status = 'queued'",
                (job_id,),
            )
        )

    def complete(
        self, job_id: str, content: bytes, *, seconds: str | None, size: str | None
    ) -> bool:
        return bool(
            self._write(
                "UPDATE video_jobs SET status = 'completed', completed_at = ?, "
                "progress = 100, content = ?, seconds = COALESCE(?, seconds), "
                f"size = COALESCE(?, size) WHERE id = ? AND {_UNFINISHED_SQL}",
                (int(time.time()), content, seconds, size, job_id),
            )
        )

    def fail(self, job_id: str, error: dict[str, Any], category: str) -> bool:
        return bool(
            self._write(
                "UPDATE video_jobs SET status = 'failed', completed_at = ?, "
                f"error = ?, error_category = ? WHERE id = ? AND {_UNFINISHED_SQL}",
                (int(time.time()), _dumps(error), category, job_id),
            )
        )

    def cancel(self, job_id: str) -> bool:
        return bool(
            self._write(
                "UPDATE video_jobs SET status = 'cancelled', completed_at = ? "
                f"WHERE id = ? AND {_UNFINISHED_SQL}",
                (int(time.time()), job_id),
            )
        )

    def delete_finished(self, job_id: str) -> bool:
        kept, args = self._kept()
        return bool(
            self._write(
                f"DELETE FROM video_jobs WHERE id = ? AND {_FINISHED_SQL} AND {kept}",
                (job_id, *args),
            )
        )

    def expire(self) -> int:
        """Delete the finished jobs kept longer than the retention; how many."""
        if self.retention_s is None:
            return 0
        return self._write(
            "DELETE FROM video_jobs WHERE completed_at IS NOT NULL "
            f"AND completed_at <= ? AND {_FINISHED_SQL}",
            (time.time() - self.retention_s,),
        )


class VideoJobs:
    """The store plus the background tasks of this process's jobs."""

    def __init__(self, store: JobStore, engine: AsyncOmni, mode: Mode) -> None:
        self._store = store
        self._engine = engine
        self._mode: Mode = mode
        self._slots = asyncio.Semaphore(MAX_RUNNING_JOBS)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def retention_s(self) -> int | None:
        return self._store.retention_s

    @classmethod
    async def start(
        cls,
        path: str | None,
        engine: AsyncOmni,
        *,
        mode: Mode = "strict",
        retention_s: int | None = None,
    ) -> VideoJobs:
        """Open the store and fail the jobs a previous process left
        unfinished; with a retention, sweep out expired jobs once a minute."""
        store = await asyncio.to_thread(JobStore, path, retention_s)
        jobs = cls(store, engine, mode)
        for job_id in await jobs._call(store.unfinished):
            details = details_for_exception(
                OmniServiceUnavailableError(RESTART_MESSAGE),
                request_id=job_id,
                mode=mode,
            )
            await jobs._call(store.fail, job_id, job_error(details), details.category)
        if retention_s is not None:
            jobs._sweeper = asyncio.create_task(jobs._sweep(), name="video-job-sweep")
        return jobs

    async def _sweep(self) -> None:
        """Delete expired jobs now and then once every SWEEP_S (they already
        read as deleted: this only gives their disk back)."""
        while True:
            try:
                expired = await self._call(self._store.expire)
            except sqlite3.Error:
                logger.warning("job store: expired jobs not deleted", exc_info=True)
            else:
                if expired:
                    logger.info("job store: %d expired job(s) deleted", expired)
            await asyncio.sleep(SWEEP_S)

    async def _call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    # -- what the routes use ---------------------------------------------------

    async def submit(
        self,
        *,
        prompt: str,
        params: dict[str, Any],
        seconds: str | None,
        size: str | None,
    ) -> Job:
        job = Job(
            id=new_job_id(),
            status="queued",
            created_at=int(time.time()),
            completed_at=None,
            model=self._engine.model_name,
            prompt=prompt,
            params=params,
            seconds=seconds,
            size=size,
            progress=0,
            error=None,
            error_category=None,
        )
        # Shielded: once its record exists a job always gets its worker, even
        # if the creating request is cancelled meanwhile (its client left);
        # otherwise the job would stay queued, unrun, until a restart.
        return await asyncio.shield(self._accept(job))

    async def _accept(self, job: Job) -> Job:
        await self._call(self._store.create, job)
        self._tasks[job.id] = asyncio.create_task(
            self._run(job.id, job.prompt, job.params), name=f"video-job-{job.id}"
        )
        return job

    def api(self, job: Job) -> dict[str, Any]:
        """``job`` as the OpenAI ``Video`` object, with its ``expires_at``."""
        return job.to_api(self.retention_s)

    async def get(self, job_id: str) -> Job | None:
        return await self._call(self._store.get, job_id)

    async def list(
        self, *, limit: int, after: str | None, newest_first: bool
    ) -> tuple[list[Job], bool] | None:
        return await self._call(
            self._store.list, limit=limit, after=after, newest_first=newest_first
        )

    async def content(self, job_id: str) -> bytes | None:
        return await self._call(self._store.content, job_id)

    async def cancel(self, job_id: str) -> bool:
        """Mark an unfinished job cancelled, then stop its task (which aborts
        its engine request). False if the job had already finished."""
        cancelled = await self._call(self._store.cancel, job_id)
        task = self._tasks.get(job_id)
        if cancelled and task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return cancelled

    async def delete(self, job_id: str) -> bool:
        return await self._call(self._store.delete_finished, job_id)

    async def shutdown(self) -> None:
        """Stop the running jobs without finishing their records (see module)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._call(self._store.close)

    # -- the worker --------------------------------------------------------------

    async def _run(self, job_id: str, prompt: str, params: dict[str, Any]) -> None:
        # The job outlives the request that created it: a context of its own,
        # so that request's client going away is neither the job's abort nor
        # its abort reason (the task inherited the request's context).
        set_abort_context(AbortContext())
        with job_span(job_id, "video"):
            await self._run_job(job_id, prompt, params)

    async def _run_job(self, job_id: str, prompt: str, params: dict[str, Any]) -> None:
        try:
            async with self._slots:
                if not await self._call(self._store.start, job_id):
                    return  # cancelled while it waited
                await self._generate(job_id, prompt, params)
        except asyncio.CancelledError:
            # DELETE already marked the job cancelled; on shutdown it stays
            # unfinished so the next start fails it with a 503.
            raise
        except Exception as exc:
            details = details_for_exception(exc, request_id=job_id, mode=self._mode)
            await self._call(
                self._store.fail, job_id, job_error(details), details.category
            )
        finally:
            self._tasks.pop(job_id, None)

    async def _generate(self, job_id: str, prompt: str, params: dict[str, Any]) -> None:
        # The job keeps the caller's per-stage list beside the video's params.
        params = dict(params)
        entries = params.pop(PARAMETER, None)
        stream = self._engine.generate(
            prompt,
            request_id=job_id,
            modalities=["video"],
            params=params,
            sampling_params_list=entries,
        )
        final = None
        async with contextlib.aclosing(stream) as outputs:
            async for output in outputs:
                if output.finished:
                    final = output
        if final is None or final.finish_reason == "abort":
            await self._call(self._store.cancel, job_id)
            return
        diffusion = final.diffusion
        if diffusion is None or diffusion.video is None:
            raise GenerationError("The pipeline produced no video.")
        seconds = size = None
        if diffusion.fps and diffusion.num_frames:
            seconds = f"{diffusion.num_frames / diffusion.fps:g}"
        if diffusion.width and diffusion.height:
            size = f"{diffusion.width}x{diffusion.height}"
        await self._call(
            self._store.complete, job_id, diffusion.video, seconds=seconds, size=size
        )
