"""``POST /v1/chat/completions``: text (and audio) chat, plain or streamed (SSE).

The request is upstream vLLM's own ``ChatCompletionRequest`` with vLLM-Omni's
``modalities``, ``audio`` and ``lora`` (``protocol.py``): every field vLLM
knows is validated as vLLM validates it, and each field the client sets is
honoured or refused with a 400 naming it (``fields.py``). The work is
``serving_text.chat``; a stream's errors follow docs/design.md §4 (statuses until
the first output, then one error event and ``[DONE]``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import StreamingResponse

from vllm_omni.entrypoints.openai import serving_text
from vllm_omni.entrypoints.openai.admission import admitted
from vllm_omni.entrypoints.openai.protocol import ChatCompletionRequest

__all__ = ["router"]

router = APIRouter()


@admitted
@router.post(
    "/v1/chat/completions",
    response_model=None,
    responses={
        200: {
            "description": "A chat completion, or with stream=true an SSE stream",
            "content": {"application/json": {}, "text/event-stream": {}},
        }
    },
)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request
) -> dict[str, Any] | StreamingResponse:
    return await serving_text.chat(request, body)
