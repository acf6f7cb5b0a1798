"""``POST /v1/audio/speech`` (WAV) and ``GET /v1/audio/voices``.

An unknown voice is a 404 raised by the talker stage (``VLLMNotFoundError``)
and comes back through the wire with its status; this module only validates
what needs no stage and returns the audio with a 200.
"""

from __future__ import annotations

import contextlib
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from vllm_omni.entrypoints.openai.fields import check_fields
from vllm_omni.entrypoints.openai.openapi import check_body
from vllm_omni.entrypoints.openai.protocol import SpeechRequest
from vllm_omni.entrypoints.openai.serving_common import (
    check_model,
    engine_of,
    request_id_of,
    require_modality,
)
from vllm_omni.errors import GenerationError

__all__ = ["router"]

router = APIRouter()


@router.post(
    "/v1/audio/speech",
    response_class=Response,
    responses={200: {"content": {"audio/wav": {}}, "description": "WAV audio"}},
)
async def create_speech(body: SpeechRequest, request: Request) -> Response:
    engine = engine_of(request)
    await engine.check_health()
    check_model(engine, body.model)
    require_modality(engine, "audio")
    talker = engine.stage_for("audio")
    check_fields("speech", body, [talker] if talker else [])
    await check_body(request, "speech", await request.json())
    params: dict[str, Any] = {"voice": body.voice}
    if body.speed is not None:
        params["speed"] = body.speed
    stream = engine.generate(
        body.input,
        request_id=request_id_of(request),
        modalities=["audio"],
        params=params,
        sampling_params_list=body.sampling_params_list,
    )
    audio: bytes | None = None
    async with contextlib.aclosing(stream) as outputs:
        async for output in outputs:
            audio = output.audio or audio
    if audio is None:
        raise GenerationError("The pipeline produced no audio.")
    return Response(audio, media_type="audio/wav")


@router.get("/v1/audio/voices")
async def list_voices(request: Request) -> dict[str, Any]:
    engine = engine_of(request)
    require_modality(engine, "audio")
    return {"voices": list(engine.voices)}
