"""Serving the speech API: a request checked, run through the talker, and
answered with its WAV; the voices the talker knows. What each status means:
docs/serving.md, "Speech".

Raises semantic exceptions only (an unknown voice is the talker's 404, back
through the wire with its status); the routes declare the request and call in.
"""

from __future__ import annotations

import contextlib
from typing import Any

from fastapi import Request

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

__all__ = ["speech", "voices"]


async def speech(request: Request, body: SpeechRequest) -> bytes:
    """``POST /v1/audio/speech``: the engine, the talker's fields, the
    document's ranges; then the WAV the pipeline made."""
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
    return audio


def voices(request: Request) -> dict[str, Any]:
    """``GET /v1/audio/voices``: the talker's voices."""
    engine = engine_of(request)
    require_modality(engine, "audio")
    return {"voices": list(engine.voices)}
