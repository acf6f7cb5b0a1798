"""``POST /v1/chat/completions``: text (and audio) chat, plain or streamed (SSE).

Streaming follows DESIGN §4: engine health, request validation and the
*first output* are awaited before the 200 goes out, so every failure up to
then is an ordinary HTTP error with its real status. After the headers, a
failure becomes exactly one ``data: {"error": …}`` event, then
``data: [DONE]``. A client that disconnects cancels the body iterator; closing
the engine stream aborts the request in every stage, and that is not an error.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictBool
from starlette.responses import StreamingResponse

from vllm_omni.entrypoints.openai.routes.common import (
    Int64,
    PositiveInt64,
    check_model,
    check_prompt,
    engine_of,
    request_id_of,
)
from vllm_omni.errors import VLLMValidationError
from vllm_omni.errors.fastapi import stream_error_details
from vllm_omni.errors.render import sse_error_events
from vllm_omni.outputs import OmniRequestOutput

__all__ = ["router"]

router = APIRouter()


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None


class AudioOptions(BaseModel):
    voice: str = "alloy"
    format: Literal["wav"] = "wav"


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    # Each is checked on its own (at least 1), so neither a 0 next to the
    # other nor a negative value is mistaken for "not given".
    max_tokens: PositiveInt64 | None = None
    max_completion_tokens: PositiveInt64 | None = None
    temperature: float | None = None
    seed: Int64 | None = None
    # vLLM's extension (``extra_body``): generate max_tokens, past any EOS.
    ignore_eos: StrictBool | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOptions | None = None


def _prompt(request: ChatCompletionRequest) -> str:
    parts: list[str] = []
    for message in request.messages:
        if isinstance(message.content, str):
            parts.append(message.content)
        elif message.content:
            parts.extend(p.text for p in message.content if p.text)
    prompt = "\n".join(p for p in parts if p)
    if not prompt.strip():
        raise VLLMValidationError("messages must contain text", parameter="messages")
    return prompt


def _params(request: ChatCompletionRequest) -> dict[str, Any]:
    params: dict[str, Any] = {}
    # max_completion_tokens supersedes the deprecated max_tokens (OpenAI, vLLM).
    max_tokens = (
        request.max_completion_tokens
        if request.max_completion_tokens is not None
        else request.max_tokens
    )
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    if request.temperature is not None:
        params["temperature"] = request.temperature
    if request.seed is not None:
        params["seed"] = request.seed
    if request.ignore_eos is not None:
        params["ignore_eos"] = request.ignore_eos
    if request.audio is not None:
        params["voice"] = request.audio.voice
    # A LoRA adapter by name (``extra_body={"lora": ...}``); the stage decides.
    lora = (request.model_extra or {}).get("lora")
    if lora is not None:
        params["lora"] = lora
    return params


def _usage(prompt: str, text: str, final: OmniRequestOutput | None) -> dict[str, int]:
    """The engine's token counts when a stage reported them (the ``vllm``
    stage does), else the reference stages' tokens: words."""
    counted = next(
        (
            meta
            for meta in reversed(list(final.meta.values()) if final else [])
            if isinstance(meta, dict)
            and isinstance(meta.get("prompt_tokens"), int)
            and isinstance(meta.get("completion_tokens"), int)
        ),
        None,
    )
    if counted is not None:
        prompt_tokens = counted["prompt_tokens"]
        completion_tokens = counted["completion_tokens"]
    else:
        prompt_tokens = len(prompt.split())
        completion_tokens = len(text.split())
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _audio_object(output: OmniRequestOutput, completion_id: str) -> dict[str, Any]:
    return {
        "id": f"audio-{completion_id}",
        "data": base64.b64encode(output.audio or b"").decode(),
        "transcript": output.text,
        "expires_at": int(time.time()) + 3600,
    }


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
    engine = engine_of(request)
    await engine.check_health()
    check_model(engine, body.model)
    prompt = _prompt(body)
    check_prompt(request, prompt, "messages")
    modalities = body.modalities or ["text"]
    request_id = request_id_of(request)
    completion_id = f"chatcmpl-{request_id}"
    stream = engine.generate(
        prompt, request_id=request_id, modalities=modalities, params=_params(body)
    )
    if body.stream:
        return await _stream(request, stream, completion_id, engine.model_name)

    async with contextlib.aclosing(stream) as outputs:
        final: OmniRequestOutput | None = None
        async for output in outputs:
            final = output
    text = final.text if final else ""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if final is not None and final.audio is not None:
        message["audio"] = _audio_object(final, completion_id)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": engine.model_name,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": (final.finish_reason if final else None) or "stop",
            }
        ],
        "usage": _usage(prompt, text, final),
    }


def _chunk(
    completion_id: str, model: str, delta: dict[str, Any], finish: str | None
) -> bytes:
    chunk = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def _delta(
    output: OmniRequestOutput, first: bool, completion_id: str
) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": "assistant"} if first else {}
    if output.text_delta:
        delta["content"] = output.text_delta
    if output.finished and output.audio is not None:
        delta["audio"] = _audio_object(output, completion_id)
    return delta


async def _stream(
    request: Request,
    stream: AsyncIterator[OmniRequestOutput],
    completion_id: str,
    model: str,
) -> StreamingResponse:
    # The first output is awaited here, before any byte is sent: a failure so
    # far propagates to the error boundary as an ordinary HTTP error.
    try:
        first = await anext(stream)
    except StopAsyncIteration:
        first = None
    except BaseException:
        await stream.aclose()  # type: ignore[attr-defined]
        raise

    async def body() -> AsyncIterator[bytes]:
        try:
            if first is not None:
                finish = first.finish_reason if first.finished else None
                yield _chunk(
                    completion_id, model, _delta(first, True, completion_id), finish
                )
                async for output in stream:
                    finish = output.finish_reason if output.finished else None
                    delta = _delta(output, False, completion_id)
                    if delta or finish:
                        yield _chunk(completion_id, model, delta, finish)
                    # Queued outputs never suspend: without this checkpoint a
                    # client that hung up is noticed only after the whole
                    # stream went to a dead socket (and other requests wait).
                    await asyncio.sleep(0)
            yield b"data: [DONE]\n\n"
        except Exception as exc:
            yield sse_error_events(stream_error_details(request, exc))
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    return StreamingResponse(body(), media_type="text/event-stream")
