"""``POST /v1/images/generations`` and ``POST /v1/images/edits`` (multipart).

Size and count are validated by the image stage (400 with ``param``). An
empty or overlong prompt is a 400 on ``prompt``. An input image is checked
here, from its bytes and header, against the server's limits
(``--max-image-bytes``, ``--max-image-pixels``, ``--max-image-frames``)
before it is sent to the image stage, which decodes it under the same limits:
an image that is too large, a bomb, truncated or not an image at all is a 422
``VLLMUnprocessableEntityError`` with ``param="image"``.
"""

from __future__ import annotations

import base64
import contextlib
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Form, Request, UploadFile

from vllm_omni.config import StageConfig
from vllm_omni.entrypoints.async_omni import AsyncOmni
from vllm_omni.entrypoints.openai.fields import (
    IMAGE_EDITS,
    IMAGE_EDITS_030,
    check_fields,
)
from vllm_omni.entrypoints.openai.openapi import check_body
from vllm_omni.entrypoints.openai.protocol import (
    INT64_MAX,
    INT64_MIN,
    SAMPLING_PARAMS_LIST_DESCRIPTION,
    Background,
    ImageGenerationRequest,
    OutputFormat,
    Quality,
)
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

__all__ = ["router"]

router = APIRouter()


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


def _image_stages(engine: AsyncOmni) -> list[StageConfig]:
    stage = engine.stage_for("image")
    return [stage] if stage is not None else []


@router.post("/v1/images/generations")
async def generate_images(
    body: ImageGenerationRequest, request: Request
) -> dict[str, Any]:
    engine = engine_of(request)
    await engine.check_health()
    check_model(engine, body.model)
    require_modality(engine, "image")
    check_prompt(request, body.prompt, "prompt")
    check_fields("image_generations", body, _image_stages(engine))
    await check_body(request, "image_generations", await request.json())
    params: dict[str, Any] = {"n": body.n, "size": body.size}
    if body.seed is not None:
        params["seed"] = body.seed
    return await _images(
        engine, body.prompt, request_id_of(request), params, body.sampling_params_list
    )


@router.post("/v1/images/edits")
async def edit_images(
    request: Request,
    image: UploadFile,
    prompt: str = Form(...),
    model: str | None = Form(None),
    n: int = Form(1, ge=1, le=INT64_MAX),
    size: str = Form("256x256"),
    response_format: Literal["b64_json"] = Form("b64_json"),
    user: str | None = Form(None),
    safety_identifier: str | None = Form(None),
    quality: Annotated[Quality, Form()] = "auto",
    background: Annotated[Background, Form()] = "auto",
    output_format: Annotated[OutputFormat, Form()] = "png",
    output_compression: int | None = Form(None, ge=0, le=100),
    input_fidelity: Literal["high", "low"] | None = Form(None),
    stream: bool = Form(False),
    partial_images: int | None = Form(None, ge=0, le=3),
    mask: UploadFile | None = None,
    seed: int | None = Form(None, ge=INT64_MIN, le=INT64_MAX),
    sampling_params_list: str | None = Form(
        None, description=f"{SAMPLING_PARAMS_LIST_DESCRIPTION} In a form: JSON text."
    ),
    # vllm-omni 0.30's edit fields, each refused by name (``fields.py``).
    negative_prompt: str | None = Form(None),
    num_inference_steps: str | None = Form(None),
    guidance_scale: str | None = Form(None),
    guidance_scale_2: str | None = Form(None),
    strength: str | None = Form(None),
    true_cfg_scale: str | None = Form(None),
    generator_device: str | None = Form(None),
    lora: str | None = Form(None),
    layers: str | None = Form(None),
    resolution: str | None = Form(None),
    bot_task: str | None = Form(None),
    sys_type: str | None = Form(None),
    system_prompt: str | None = Form(None),
    return_stage_metrics: str | None = Form(None),
    # A file or text: read from the form as given (and refused).
    mask_image: Annotated[Any, Form()] = None,
    reference_image: Annotated[Any, Form()] = None,
    image_array: Annotated[Any, Form(alias="image[]")] = None,
    url: str | None = Form(None),
    url_array: str | None = Form(None, alias="url[]"),
) -> dict[str, Any]:
    engine = engine_of(request)
    await engine.check_health()
    check_model(engine, model)
    require_modality(engine, "image")
    check_prompt(request, prompt, "prompt")
    form = await request.form()
    given = {
        "quality": None if quality == "auto" else quality,
        "background": None if background == "auto" else background,
        "output_format": None if output_format == "png" else output_format,
        "output_compression": output_compression,
        "input_fidelity": input_fidelity,
        "stream": stream or None,
        "partial_images": partial_images,
        "mask": mask,
        "seed": seed,
        # The rest as the form gave them (an empty field is absent), and
        # every name that is not a field of this route (refused).
        **{
            name: value
            for name, value in form.multi_items()
            if (name in IMAGE_EDITS_030 and value != "") or name not in IMAGE_EDITS
        },
    }
    stages = _image_stages(engine)
    check_fields("image_edits", given, stages)
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
    if seed is not None:
        params["seed"] = seed
    entries = form_entries(sampling_params_list)
    return await _images(engine, prompt, request_id_of(request), params, entries)
