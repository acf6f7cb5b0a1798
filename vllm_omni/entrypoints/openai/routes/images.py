"""``POST /v1/images/generations`` and ``POST /v1/images/edits`` (multipart).

Size and count are validated by the image stage (400 with ``param``); an input
image that does not decode is a 422 ``VLLMUnprocessableEntityError`` with
``param="image"``, raised by the stage that tried to decode it.
"""

from __future__ import annotations

import base64
import contextlib
import time
from typing import Any, Literal

from fastapi import APIRouter, Form, Request, UploadFile
from pydantic import BaseModel

from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.entrypoints.openai.routes.common import (
    check_model,
    engine_of,
    request_id_of,
    require_modality,
)
from vllm_omni.errors import GenerationError, VLLMValidationError

__all__ = ["router"]

router = APIRouter()
_MAX_UPLOAD_BYTES = 16 * 1024 * 1024


class ImageGenerationRequest(BaseModel):
    prompt: str
    model: str | None = None
    n: int = 1
    size: str = "256x256"
    seed: int | None = None
    response_format: Literal["b64_json"] = "b64_json"


async def _images(
    engine: AsyncOmni, prompt: str, request_id: str, params: dict[str, Any]
) -> dict[str, Any]:
    stream = engine.generate(
        prompt, request_id=request_id, modalities=["image"], params=params
    )
    images: list[bytes] = []
    async with contextlib.aclosing(stream) as outputs:
        async for output in outputs:
            images = output.images or images
    if not images:
        raise GenerationError("The pipeline produced no image.")
    return {
        "created": int(time.time()),
        "data": [{"b64_json": base64.b64encode(png).decode()} for png in images],
    }


@router.post("/v1/images/generations")
async def generate_images(
    body: ImageGenerationRequest, request: Request
) -> dict[str, Any]:
    engine = engine_of(request)
    await engine.check_health()
    check_model(engine, body.model)
    require_modality(engine, "image")
    params: dict[str, Any] = {"n": body.n, "size": body.size}
    if body.seed is not None:
        params["seed"] = body.seed
    return await _images(engine, body.prompt, request_id_of(request), params)


@router.post("/v1/images/edits")
async def edit_images(
    request: Request,
    image: UploadFile,
    prompt: str = Form(...),
    model: str | None = Form(None),
    n: int = Form(1),
    size: str = Form("256x256"),
) -> dict[str, Any]:
    engine = engine_of(request)
    await engine.check_health()
    check_model(engine, model)
    require_modality(engine, "image")
    data = await image.read(_MAX_UPLOAD_BYTES + 1)
    if len(data) > _MAX_UPLOAD_BYTES:
        raise VLLMValidationError(
            f"image must be at most {_MAX_UPLOAD_BYTES} bytes", parameter="image"
        )
    params: dict[str, Any] = {"n": n, "size": size, "image": data}
    return await _images(engine, prompt, request_id_of(request), params)
