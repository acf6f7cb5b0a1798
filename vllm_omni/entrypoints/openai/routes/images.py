"""``POST /v1/images/generations`` and ``POST /v1/images/edits`` (multipart):
the requests as the OpenAI API declares them; the work is ``serving_images``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Form, Request, UploadFile

from vllm_omni.entrypoints.openai import serving_images
from vllm_omni.entrypoints.openai.admission import admitted
from vllm_omni.entrypoints.openai.protocol import (
    INT64_MAX,
    INT64_MIN,
    SAMPLING_PARAMS_LIST_DESCRIPTION,
    Background,
    ImageGenerationRequest,
    OutputFormat,
    Quality,
)

__all__ = ["router"]

router = APIRouter()


@admitted
@router.post("/v1/images/generations")
async def generate_images(
    body: ImageGenerationRequest, request: Request
) -> dict[str, Any]:
    return await serving_images.generate(request, body)


@admitted
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
    return await serving_images.edit(
        request,
        image,
        prompt=prompt,
        model=model,
        n=n,
        size=size,
        sampling_params_list=sampling_params_list,
        options={
            "quality": quality,
            "background": background,
            "output_format": output_format,
            "output_compression": output_compression,
            "input_fidelity": input_fidelity,
            "stream": stream,
            "partial_images": partial_images,
            "mask": mask,
            "seed": seed,
        },
    )
