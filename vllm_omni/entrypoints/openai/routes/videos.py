"""The OpenAI Videos API over durable async jobs (``client.videos.*``).

Routes::

    POST   /v1/videos                 create a job (JSON or multipart form)
    GET    /v1/videos                 list jobs, newest first (cursor pages)
    GET    /v1/videos/{id}            the job; a failed one carries its stored error
    DELETE /v1/videos/{id}            remove a finished job, cancel an unfinished one
    GET    /v1/videos/{id}/content    the GIF of a completed job
    POST   /v1/videos/{id}/remix      declared, not implemented (501)

Statuses (docs/design.md §4, async jobs): the request is checked here, before a job
exists (400 with ``param``: ``prompt``, ``seconds``, ``size``, also outside
the video stage's ranges, as ``/openapi.json`` states them; 404 for another
model; 503 when the pipeline has no video stage). A job that fails later
(the stage raised) is a 200 with ``status: "failed"`` and the stored
``error`` unchanged; its content answers with the stored status and body;
content of an unfinished or cancelled job is 409; an unknown id, or an
unknown ``after`` cursor, is 404.

This module owns request parsing and the mapping from job state to semantic
exceptions. It must not build statuses, envelopes or error responses (the
error boundary renders what it raises), and it keeps no job state of its
own: that is ``vllm_omni.entrypoints.openai.jobs``.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from starlette.datastructures import UploadFile
from starlette.requests import HTTPConnection
from starlette.responses import Response

from vllm_omni.entrypoints.openai.fields import check_fields
from vllm_omni.entrypoints.openai.jobs import Job, VideoJobs
from vllm_omni.entrypoints.openai.openapi import check_body
from vllm_omni.entrypoints.openai.protocol import (
    FORM_TYPES,
    VIDEO_CREATE_BODY,
    VIDEO_DEFAULT_PAGE,
    VIDEO_DEFAULTS,
    VIDEO_MAX_PAGE,
    VIDEO_MAX_PROMPT_CHARS,
    VIDEO_PAGE_PARAMETERS,
    VIDEO_VARIANT_PARAMETER,
    VIDEO_VARIANTS,
)
from vllm_omni.entrypoints.openai.serving_common import (
    check_model,
    engine_of,
    require_modality,
)
from vllm_omni.entrypoints.sampling_params_list import (
    PARAMETER,
    form_entries,
    per_stage_params,
)
from vllm_omni.errors import (
    OmniConflictError,
    OmniNotImplementedError,
    OmniServiceUnavailableError,
    VLLMNotFoundError,
    VLLMValidationError,
    to_exception,
)
from vllm_omni.errors.http import replayed
from vllm_omni.stages import video as video_stage
from vllm_omni.stages.base import SIZE_STEP
from vllm_omni.stages.image import SEED_RANGE

__all__ = ["init_state", "router", "shutdown_state"]

router = APIRouter()

_SECONDS_RE = re.compile(r"[0-9]{1,4}(?:\.[0-9]{1,3})?")
_SIZE_RE = re.compile(r"[0-9]{1,5}x[0-9]{1,5}")
_LIMIT_RE = re.compile(r"[0-9]{1,4}")
_INTEGER_RE = re.compile(r"[0-9]{1,20}")


async def init_state(app: FastAPI, args: argparse.Namespace) -> None:
    """Open the job store; jobs a previous process left unfinished fail (503)."""
    app.state.video_jobs = await VideoJobs.start(
        getattr(args, "job_store", None),
        app.state.engine_client,
        mode=getattr(app.state, "error_mode", "strict"),
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


# -- request parsing -----------------------------------------------------------


async def _create_fields(request: Request) -> tuple[dict[str, Any], str]:
    """The create fields, from a multipart/url-encoded form or a JSON object,
    and the media type they came as."""
    content_type = request.headers.get("content-type", "").lower()
    form_type = next((t for t in FORM_TYPES if content_type.startswith(t)), None)
    if form_type is not None:
        fields: dict[str, Any] = {}
        async with request.form() as form:
            for key, value in form.multi_items():
                if isinstance(value, UploadFile):
                    if key == "input_reference":
                        raise OmniNotImplementedError(
                            "input_reference is not supported by this server."
                        )
                    raise VLLMValidationError(
                        "file uploads are not accepted here", parameter=key
                    )
                fields[key] = value
        return fields, form_type
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        # Only the client's bytes are parsed here: undecodable, not JSON, an
        # integer past the digit limit, or nested too deep.
        body = None
    if not isinstance(body, dict):
        raise VLLMValidationError(
            "The request body must be a JSON object or a multipart form."
        )
    return body, "application/json"


def _string(fields: dict[str, Any], name: str) -> str | None:
    value = fields.get(name)
    if value is not None and not isinstance(value, str):
        raise VLLMValidationError(f"{name} must be a string", parameter=name)
    return value


def _seconds(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, str) and _SECONDS_RE.fullmatch(value.strip()):
        # float() strips fewer blanks than str.strip() (not "\x1c"..."\x1f").
        value = float(value.strip())
    # Compared before any conversion: float() of a huge int would overflow.
    if isinstance(value, int | float) and not isinstance(value, bool):
        if 0 < value < 10_000:
            return float(value)
    raise VLLMValidationError(
        "seconds must be a positive number of seconds, e.g. '4'",
        parameter="seconds",
    )


def _size(fields: dict[str, Any]) -> str | None:
    size = _string(fields, "size")
    if size is not None and not _SIZE_RE.fullmatch(size):
        raise VLLMValidationError(
            "size must be 'WIDTHxHEIGHT', e.g. '128x128'", parameter="size"
        )
    return size


def _default(name: str, value: object) -> bool:
    """A 0.30 field at its default (a form gives it as JSON text): not set."""
    if name not in VIDEO_DEFAULTS:
        return False
    default = VIDEO_DEFAULTS[name]
    if isinstance(value, str):
        return value.strip() == json.dumps(default)
    return type(value) is type(default) and value == default


def _integer(fields: dict[str, Any], name: str, low: int, high: int) -> int | None:
    """``fields[name]`` as an integer in ``[low, high]`` (a form's digits, a
    JSON number without a fraction), or ``None`` when absent."""
    value = fields.get(name)
    if value is None:
        return None
    if isinstance(value, str) and _INTEGER_RE.fullmatch(value.strip()):
        value = int(value.strip())
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not low <= value <= high
    ):
        raise VLLMValidationError(
            f"{name} must be an integer from {low} to {high}", parameter=name
        )
    return value


def _width_and_height(fields: dict[str, Any]) -> str | None:
    """vllm-omni's ``width`` and ``height``, together, as the size ``WxH``."""
    low, high = video_stage.SIZE_RANGE
    sides = {name: _integer(fields, name, low, high) for name in ("width", "height")}
    if all(side is None for side in sides.values()):
        return None
    for name, side in sides.items():
        if side is None:
            other = "height" if name == "width" else "width"
            raise VLLMValidationError(f"{name} is needed with {other}", parameter=name)
        if side % SIZE_STEP:
            raise VLLMValidationError(
                f"{name} must be a multiple of {SIZE_STEP}", parameter=name
            )
    if fields.get("size") is not None:
        raise VLLMValidationError(
            "give size or width and height, not both", parameter="width"
        )
    return f"{sides['width']}x{sides['height']}"


def _entries(fields: dict[str, Any], media_type: str) -> object:
    """``sampling_params_list``: a JSON body's list, or a form's JSON text."""
    entries = fields.get(PARAMETER)
    if entries is None or media_type == "application/json":
        return entries
    return form_entries(entries)


def _prompt(fields: dict[str, Any]) -> str:
    prompt = fields.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise VLLMValidationError(
            "prompt is required and must be a non-empty string", parameter="prompt"
        )
    if len(prompt) > VIDEO_MAX_PROMPT_CHARS:
        raise VLLMValidationError(
            f"prompt must be at most {VIDEO_MAX_PROMPT_CHARS} characters",
            parameter="prompt",
        )
    return prompt


def _page_args(request: Request) -> tuple[int, str | None, bool]:
    query = request.query_params
    raw_limit = query.get("limit")
    limit = VIDEO_DEFAULT_PAGE
    if raw_limit is not None:
        limit = int(raw_limit) if _LIMIT_RE.fullmatch(raw_limit) else 0
        if not 1 <= limit <= VIDEO_MAX_PAGE:
            raise VLLMValidationError(
                f"limit must be an integer between 1 and {VIDEO_MAX_PAGE}",
                parameter="limit",
            )
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise VLLMValidationError("order must be 'asc' or 'desc'", parameter="order")
    return limit, query.get("after"), order == "desc"


# -- routes ----------------------------------------------------------------------


@router.post("/v1/videos", openapi_extra={"requestBody": VIDEO_CREATE_BODY})
async def create_video(request: Request) -> dict[str, Any]:
    engine = engine_of(request)
    await engine.check_health()
    fields, media_type = await _create_fields(request)
    check_model(engine, _string(fields, "model"))
    require_modality(engine, "video")
    prompt = _prompt(fields)
    seconds = _seconds(fields.get("seconds"))
    size = _size(fields)
    stage = engine.stage_for("video")
    given = {name: value for name, value in fields.items() if not _default(name, value)}
    check_fields("videos", given, [stage] if stage else [])
    size = _width_and_height(fields) or size
    # The video stage's ranges, before a job exists.
    await check_body(request, "videos", fields, media_type)
    params: dict[str, Any] = {
        name: value
        for name, value in (
            ("seconds", seconds),
            ("size", size),
            ("fps", _integer(fields, "fps", *video_stage.FPS_RANGE)),
            ("seed", _integer(fields, "seed", *SEED_RANGE)),
        )
        if value is not None
    }
    # Checked now, as the rest of the body: the job runs after the 200.
    entries = _entries(fields, media_type)
    if entries is not None and per_stage_params(engine.config.stages, entries):
        params[PARAMETER] = entries
    jobs = _jobs_of(request)
    job = await jobs.submit(
        prompt=prompt,
        params=params,
        seconds=None if seconds is None else f"{seconds:g}",
        size=size,
    )
    return jobs.api(job)


@router.get("/v1/videos", openapi_extra={"parameters": VIDEO_PAGE_PARAMETERS})
async def list_videos(request: Request) -> dict[str, Any]:
    limit, after, newest_first = _page_args(request)
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
