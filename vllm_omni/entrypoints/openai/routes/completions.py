"""``POST /v1/completions``: text completion, plain or streamed (SSE).

The request is upstream vLLM's own ``CompletionRequest`` with vLLM-Omni's
``lora`` (``protocol.py``), validated as vLLM validates it; each field the
client sets is honoured or refused with a 400 naming it (``fields.py``). The
work is ``serving_text.completion``, under chat's error contract.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import StreamingResponse

from vllm_omni.entrypoints.openai import serving_text
from vllm_omni.entrypoints.openai.admission import admitted
from vllm_omni.entrypoints.openai.protocol import CompletionRequest

__all__ = ["router"]

router = APIRouter()


@admitted
@router.post(
    "/v1/completions",
    response_model=None,
    responses={
        200: {
            "description": "A completion, or with stream=true an SSE stream",
            "content": {"application/json": {}, "text/event-stream": {}},
        }
    },
)
async def create_completion(
    body: CompletionRequest, request: Request
) -> dict[str, Any] | StreamingResponse:
    return await serving_text.completion(request, body)
