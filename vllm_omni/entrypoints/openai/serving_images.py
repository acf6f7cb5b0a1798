"""Serving the Images API: a generation or an edit checked, run through the
image stage, and answered as the OpenAI API answers. What each status means:
docs/serving.md, "Images".

Raises semantic exceptions only; the routes declare the request and call in.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from fastapi import Request, UploadFile

from vllm_omni.config import StageConfig
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.entrypoints.openai.fields import (
    IMAGE_EDITS,
    IMAGE_EDITS_030,
    check_fields,
)
from vllm_omni.entrypoints.openai.openapi import check_body
from vllm_omni.entrypoints.openai.protocol import ImageGenerationRequest
from vllm_omni.entrypoints.openai.serving_common import (
    check_model,
    check_prompt,
    engine_of,
    limits_of,
    request_id_of,
    require_modality,
)
from vllm_omni.entrypoints.sampling_params_list import form_entries
from vllm_omni.errors import GenerationError, VLLMUnprocessableEntityError
from vllm_omni.stages.image import probe_image

__all__ = ["EDIT_DEFAULTS", "edit", "generate"]

# An edit form's OpenAI options at the value that asks for nothing: such a
# field is not "set" (``check_fields`` reads only what the client asked for).
EDIT_DEFAULTS: dict[str, Any] = {
    "quality": "auto",
    "background": "auto",
    "output_format": "png",
    "output_compression": None,
    "input_fidelity": None,
    "stream": False,
    "partial_images": None,
    "mask": None,
    "seed": None,
}


async def generate(request: Request, body: ImageGenerationRequest) -> dict[str, Any]:
    """``POST /v1/images/generations``."""
    engine = await _checked_engine(request, body.model, body.prompt)
    check_fields("image_generations", body, _image_stages(engine))
    await check_body(request, "image_generations", await request.json())
    params: dict[str, Any] = {"n": body.n, "size": body.size}
    if body.seed is not None:
        params["seed"] = body.seed
    return await _images(
        engine, body.prompt, request_id_of(request), params, body.sampling_params_list
    )


async def edit(
    request: Request,
    image: UploadFile,
    *,
    prompt: str,
    model: str | None,
    n: int,
    size: str,
    sampling_params_list: str | None,
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """``POST /v1/images/edits``: ``options`` are the form's OpenAI options
    (``EDIT_DEFAULTS``' names), each refused unless the stage honours it;
    the form's other names are read as the client sent them."""
    engine = await _checked_engine(request, model, prompt)
    form = await request.form()
    given = {
        **{
            name: None if value == EDIT_DEFAULTS[name] else value
            for name, value in options.items()
        },
        # The rest as the form gave them (an empty field is absent), and
        # every name that is not a field of this route (refused).
        **{
            name: value
            for name, value in form.multi_items()
            if (name in IMAGE_EDITS_030 and value != "") or name not in IMAGE_EDITS
        },
    }
    check_fields("image_edits", given, _image_stages(engine))
    limits = limits_of(request)
    data = await image.read(limits.max_image_bytes + 1)
    if len(data) > limits.max_image_bytes:
        raise VLLMUnprocessableEntityError(
            f"The input image must be at most {limits.max_image_bytes} bytes.",
            parameter="image",
        )
    probe_image(
        data, max_pixels=limits.max_image_pixels, max_frames=limits.max_image_frames
    )
    params: dict[str, Any] = {
        "n": n,
        "size": size,
        "image": data,
        "max_image_pixels": limits.max_image_pixels,
        "max_image_frames": limits.max_image_frames,
    }
    if options.get("seed") is not None:
        params["seed"] = options["seed"]
    entries = form_entries(sampling_params_list)
    return await _images(engine, prompt, request_id_of(request), params, entries)


async def _checked_engine(
    request: Request, model: str | None, prompt: str
) -> AsyncOmni:
    """The engine, once it is healthy, serves ``model``, has an image stage
    and the prompt is one it takes."""
    engine = engine_of(request)
    await engine.check_health()
    check_model(engine, model)
    require_modality(engine, "image")
    check_prompt(request, prompt, "prompt")
    return engine


def _image_stages(engine: AsyncOmni) -> list[StageConfig]:
    stage = engine.stage_for("image")
    return [stage] if stage is not None else []


async def _images(
    engine: AsyncOmni,
    prompt: str,
    request_id: str,
    params: dict[str, Any],
    sampling_params_list: list[Any] | None,
) -> dict[str, Any]:
    stream = engine.generate(
        prompt,
        request_id=request_id,
        modalities=["image"],
        params=params,
        sampling_params_list=sampling_params_list,
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
