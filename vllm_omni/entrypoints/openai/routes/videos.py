"""The OpenAI Videos API over durable async jobs (``client.videos.*``).

Routes: create (JSON or form), list, retrieve, delete, content, and remix
(declared, 501). Requests are read by ``serving_videos``, jobs kept by
``jobs``; the statuses are in docs/serving.md, "Videos", and docs/design.md
§4 (async jobs). Maps job state to semantic exceptions; builds no statuses.
"""

from __future__ import annotations

import argparse
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from starlette.requests import HTTPConnection
from starlette.responses import Response

from vllm_omni.entrypoints.openai.jobs import Job, VideoJobs
from vllm_omni.entrypoints.openai.protocol import (
    VIDEO_CREATE_BODY,
    VIDEO_PAGE_PARAMETERS,
    VIDEO_VARIANT_PARAMETER,
    VIDEO_VARIANTS,
)
from vllm_omni.entrypoints.openai.serving_common import engine_of
from vllm_omni.entrypoints.openai.serving_videos import page_args, read_create
from vllm_omni.errors import (
    OmniConflictError,
    OmniNotImplementedError,
    OmniServiceUnavailableError,
    VLLMNotFoundError,
    VLLMValidationError,
    to_exception,
)
from vllm_omni.errors.http import replayed
from vllm_omni.errors.http.reporting import error_mode

__all__ = ["init_state", "router", "shutdown_state"]

router = APIRouter()


async def init_state(app: FastAPI, args: argparse.Namespace) -> None:
    """Open the job store; jobs a previous process left unfinished fail (503).
    An engine in another process (``--api-server-count``) brings its own."""
    remote = getattr(app.state.engine_client, "video_jobs", None)
    if remote is not None:
        app.state.video_jobs = remote
        return
    app.state.video_jobs = await VideoJobs.start(
        getattr(args, "job_store", None),
        app.state.engine_client,
        mode=error_mode(app),
        retention_s=getattr(args, "job_retention", None),
    )


async def shutdown_state(app: FastAPI) -> None:
    jobs: VideoJobs | None = getattr(app.state, "video_jobs", None)
    app.state.video_jobs = None
    if jobs is not None:
        await jobs.shutdown()


def _jobs_of(conn: HTTPConnection) -> VideoJobs:
    jobs: VideoJobs | None = getattr(conn.app.state, "video_jobs", None)
    if jobs is None:
        raise OmniServiceUnavailableError("The video job store is not running.")
    return jobs


async def _job(conn: HTTPConnection, video_id: str) -> Job:
    job = await _jobs_of(conn).get(video_id)
    if job is None:
        raise VLLMNotFoundError("No video job with this id.")
    return job


# -- routes ----------------------------------------------------------------------


@router.post("/v1/videos", openapi_extra={"requestBody": VIDEO_CREATE_BODY})
async def create_video(request: Request) -> dict[str, Any]:
    engine = engine_of(request)
    await engine.check_health()
    create = await read_create(request, engine)
    jobs = _jobs_of(request)
    job = await jobs.submit(
        prompt=create.prompt,
        params=create.params,
        seconds=create.seconds,
        size=create.size,
    )
    return jobs.api(job)


@router.get("/v1/videos", openapi_extra={"parameters": VIDEO_PAGE_PARAMETERS})
async def list_videos(request: Request) -> dict[str, Any]:
    limit, after, newest_first = page_args(request)
    jobs = _jobs_of(request)
    page = await jobs.list(limit=limit, after=after, newest_first=newest_first)
    if page is None:
        error = VLLMNotFoundError("after must be the id of a listed video job.")
        error.parameter = "after"  # type: ignore[attr-defined]
        raise error
    listed, has_more = page
    data = [jobs.api(job) for job in listed]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


@router.get("/v1/videos/{video_id}")
async def retrieve_video(video_id: str, request: Request) -> dict[str, Any]:
    return _jobs_of(request).api(await _job(request, video_id))


@router.delete("/v1/videos/{video_id}")
async def delete_video(video_id: str, request: Request) -> dict[str, Any]:
    jobs = _jobs_of(request)
    job = await _job(request, video_id)
    if not job.finished and await jobs.cancel(video_id):
        # Kept as a record (status "cancelled"); a second DELETE removes it.
        return {
            "id": video_id,
            "object": "video.deleted",
            "deleted": False,
            "status": "cancelled",
        }
    if not await jobs.delete(video_id):
        raise VLLMNotFoundError("No video job with this id.")
    return {"id": video_id, "object": "video.deleted", "deleted": True}


@router.get(
    "/v1/videos/{video_id}/content",
    openapi_extra={"parameters": [VIDEO_VARIANT_PARAMETER]},
)
async def download_video(video_id: str, request: Request) -> Response:
    variant = request.query_params.get("variant", "video")
    if variant not in VIDEO_VARIANTS:
        raise VLLMValidationError(
            f"variant must be one of {', '.join(VIDEO_VARIANTS)}", parameter="variant"
        )
    job = await _job(request, video_id)
    if job.status == "failed":
        # The stored status and body, exactly as the job recorded them; it was
        # logged when the job failed, so reading it back logs at INFO.
        raise replayed(to_exception(job.stored_error()))
    if job.status != "completed":
        raise OmniConflictError(
            f"The video job is {job.status.replace('_', ' ')}; it has no content."
        )
    if variant != "video":
        raise OmniNotImplementedError(
            f"The {variant} variant is not available; download the video."
        )
    content = await _jobs_of(request).content(video_id)
    if content is None:
        raise VLLMNotFoundError("No video job with this id.")
    return Response(content, media_type="image/gif")


@router.post("/v1/videos/{video_id}/remix")
async def remix_video(video_id: str) -> dict[str, Any]:
    raise OmniNotImplementedError("Video remix is not implemented by this server.")
