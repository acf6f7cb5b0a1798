"""Reading the Videos API's requests: a job's create fields (a JSON body or
a form) checked as far as they can be before a job exists, and a list's
query. What each status means: docs/serving.md, "Videos".

Raises semantic exceptions only; keeps no job state (``jobs.py`` does).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.datastructures import UploadFile
from starlette.requests import Request

from vllm_omni.entrypoints.openai.fields import check_fields
from vllm_omni.entrypoints.openai.openapi import check_body
from vllm_omni.entrypoints.openai.protocol import (
    FORM_TYPES,
    VIDEO_DEFAULT_PAGE,
    VIDEO_DEFAULTS,
    VIDEO_MAX_PAGE,
    VIDEO_MAX_PROMPT_CHARS,
)
from vllm_omni.entrypoints.openai.serving_common import (
    check_model,
    require_modality,
)
from vllm_omni.entrypoints.sampling_params_list import (
    PARAMETER,
    form_entries,
    per_stage_params,
)
from vllm_omni.errors import OmniNotImplementedError, VLLMValidationError
from vllm_omni.stages import stage_range
from vllm_omni.stages.ranges import Integers, Sizes

if TYPE_CHECKING:
    from vllm_omni.entrypoints.async_omni import AsyncOmni

__all__ = ["VideoCreate", "page_args", "parse_seconds", "read_create"]

_SECONDS_RE = re.compile(r"[0-9]{1,4}(?:\.[0-9]{1,3})?")
_SIZE_RE = re.compile(r"[0-9]{1,5}x[0-9]{1,5}")
_LIMIT_RE = re.compile(r"[0-9]{1,4}")
_INTEGER_RE = re.compile(r"[0-9]{1,20}")


@dataclass(frozen=True, slots=True)
class VideoCreate:
    """A checked create request: what the job runs with."""

    prompt: str
    params: dict[str, Any]
    # As the job reports them (``seconds`` as text, e.g. "4").
    seconds: str | None
    size: str | None


async def read_create(request: Request, engine: AsyncOmni) -> VideoCreate:
    """The create request's fields, checked in the order a client sees their
    errors: the body, the model, the pipeline, each field, the honoured
    fields, the stage's ranges (``check_body``), the per-stage list."""
    fields, media_type = await _create_fields(request)
    check_model(engine, _string(fields, "model"))
    require_modality(engine, "video")
    prompt = _prompt(fields)
    seconds = parse_seconds(fields.get("seconds"))
    size = _size(fields)
    stage = engine.stage_for("video")
    given = {name: value for name, value in fields.items() if not _default(name, value)}
    check_fields("videos", given, [stage] if stage else [])
    size = _width_and_height(fields) or size
    # The video stage's ranges, before a job exists.
    await check_body(request, "videos", fields, media_type)
    fps = stage_range("video", "fps", Integers)
    seed = stage_range("video", "seed", Integers)
    params: dict[str, Any] = {
        name: value
        for name, value in (
            ("seconds", seconds),
            ("size", size),
            ("fps", _integer(fields, "fps", fps.low, fps.high)),
            ("seed", _integer(fields, "seed", seed.low, seed.high)),
        )
        if value is not None
    }
    # Checked now, as the rest of the body: the job runs after the 200.
    entries = _entries(fields, media_type)
    if entries is not None and per_stage_params(engine.config.stages, entries):
        params[PARAMETER] = entries
    return VideoCreate(
        prompt=prompt,
        params=params,
        seconds=None if seconds is None else f"{seconds:g}",
        size=size,
    )


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


def parse_seconds(value: object) -> float | None:
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
    size = stage_range("video", "size", Sizes)
    sides = {
        name: _integer(fields, name, size.low, size.high)
        for name in ("width", "height")
    }
    if all(side is None for side in sides.values()):
        return None
    for name, side in sides.items():
        if side is None:
            other = "height" if name == "width" else "width"
            raise VLLMValidationError(f"{name} is needed with {other}", parameter=name)
        if side % size.step:
            raise VLLMValidationError(
                f"{name} must be a multiple of {size.step}", parameter=name
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


def page_args(request: Request) -> tuple[int, str | None, bool]:
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
