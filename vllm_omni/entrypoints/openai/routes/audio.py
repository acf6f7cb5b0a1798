"""``POST /v1/audio/speech`` (WAV) and ``GET /v1/audio/voices``: the requests
as the OpenAI API declares them; the work is ``serving_speech``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from vllm_omni.entrypoints.openai import serving_speech
from vllm_omni.entrypoints.openai.admission import admitted
from vllm_omni.entrypoints.openai.protocol import SpeechRequest

__all__ = ["router"]

router = APIRouter()


@admitted
@router.post(
    "/v1/audio/speech",
    response_class=Response,
    responses={200: {"content": {"audio/wav": {}}, "description": "WAV audio"}},
)
async def create_speech(body: SpeechRequest, request: Request) -> Response:
    audio = await serving_speech.speech(request, body)
    return Response(audio, media_type="audio/wav")


@router.get("/v1/audio/voices")
async def list_voices(request: Request) -> dict[str, Any]:
    return serving_speech.voices(request)
