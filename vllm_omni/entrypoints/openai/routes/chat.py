"""``POST /v1/chat/completions``: text (and audio) chat, plain or streamed (SSE).

The request is upstream vLLM's own ``ChatCompletionRequest`` (imported, with
vLLM-Omni's ``modalities``, ``audio`` and ``lora`` added), so every field
vLLM knows is validated exactly as vLLM validates it, with its ``param``.
Each field the client sets is then honoured by the pipeline or refused with
a 400 naming it (``fields.py``): a ``vllm`` stage receives the request
itself and renders and samples it with upstream's code; the reference
``text`` stage honours the few fields it implements.

Streaming follows DESIGN §4: engine health, request validation and the
*first output* are awaited before the 200 goes out, so every failure up to
then is an ordinary HTTP error with its real status. After the headers, a
failure becomes exactly one ``data: {"error": …}`` event, then
``data: [DONE]``. A client that disconnects cancels the body iterator; closing
the engine stream aborts the request in every stage, and that is not an error.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import StreamingResponse

from vllm_omni.config import StageConfig
from vllm_omni.entrypoints.openai.openapi import check_body
from vllm_omni.entrypoints.openai.protocol import (
    ROLES,
    ChatCompletionRequest,
    UpstreamChatCompletionRequest,
)
from vllm_omni.entrypoints.openai.routes.common import (
    check_model,
    check_prompt,
    engine_of,
    request_id_of,
)
from vllm_omni.entrypoints.openai.routes.generation import (
    check_request,
    sse,
    stream_chunks,
    text_stage,
    upstream_json,
    usage,
)
from vllm_omni.errors import VLLMValidationError
from vllm_omni.outputs import OmniRequestOutput, TextChoice

__all__ = ["router"]

router = APIRouter()


def _prompt(messages: list[Any], stage: StageConfig | None) -> str:
    """The messages' text (what the guardrail and the reference stage read).

    A role outside the OpenAI API is a 400 on that role; a content part that
    is not text is a 400 on that part unless a ``vllm`` stage renders it.
    """
    parts: list[str] = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise VLLMValidationError(
                f"role must be one of {', '.join(ROLES)}",
                parameter=f"messages[{i}].role",
            )
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
            continue
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text") or ""))
            elif stage is None or stage.kind != "vllm":
                where = (
                    "here" if stage is None else f"by stage {stage.id} ({stage.name})"
                )
                raise VLLMValidationError(
                    f"non-text content is not supported {where}",
                    parameter=f"messages[{i}].content[{j}]",
                )
    prompt = "\n".join(p for p in parts if p)
    if not prompt.strip():
        raise VLLMValidationError("messages must contain text", parameter="messages")
    return prompt


def _params(
    body: ChatCompletionRequest, raw: dict[str, Any], stage: StageConfig
) -> dict[str, Any]:
    """What the stages read: a ``vllm`` stage the request itself, the
    reference text stage its few fields; the talker the voice."""
    params: dict[str, Any] = {}
    if stage.kind == "vllm":
        params["openai"] = {
            "api": "chat",
            "request": upstream_json(raw, UpstreamChatCompletionRequest),
        }
        if body.lora is not None:
            params["lora"] = body.lora
    else:
        # Each under its own name, so the stage's 400 names the one given.
        for name, value in (
            ("max_tokens", body.max_tokens),
            ("max_completion_tokens", body.max_completion_tokens),
            ("temperature", body.temperature),
            ("seed", body.seed),
            ("stop", body.stop or None),
            ("n", body.n if body.n != 1 else None),
        ):
            if value is not None:
                params[name] = value
    if body.audio is not None:
        params["voice"] = body.audio.voice
    return params


def _modalities(body: ChatCompletionRequest) -> list[str]:
    modalities = body.modalities or ["text"]
    if "audio" in modalities and (body.n or 1) > 1:
        raise VLLMValidationError(
            "n > 1 is not supported with audio output", parameter="n"
        )
    if body.audio is not None and "audio" not in modalities:
        raise VLLMValidationError(
            'audio options need "audio" in modalities', parameter="audio"
        )
    return modalities


def _audio_object(output: OmniRequestOutput, completion_id: str) -> dict[str, Any]:
    return {
        "id": f"audio-{completion_id}",
        "data": base64.b64encode(output.audio or b"").decode(),
        "transcript": output.text,
        "expires_at": int(time.time()) + 3600,
    }


def _logprobs(logprobs: Any) -> dict[str, Any] | None:
    return None if logprobs is None else {"content": logprobs}


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
    raw = await request.json()
    prompt = _prompt(raw.get("messages") or [], engine.stage_for("text"))
    check_prompt(request, prompt, "messages")
    stage = text_stage(engine)
    check_request(request, "chat", body, stage)
    modalities = _modalities(body)
    await check_body(request, "chat", raw)
    request_id = request_id_of(request)
    completion_id = f"chatcmpl-{request_id}"
    stream = engine.generate(
        prompt,
        request_id=request_id,
        modalities=modalities,
        params=_params(body, raw, stage),
    )
    if body.stream:
        return await _stream(
            request, stream, body, prompt, completion_id, engine.model_name
        )

    async with contextlib.aclosing(stream) as outputs:
        final: OmniRequestOutput | None = None
        async for output in outputs:
            final = output
    choices = (final.choices if final else None) or [TextChoice(index=0)]
    response_choices = []
    for choice in choices:
        message: dict[str, Any] = {"role": "assistant", "content": choice.text}
        if choice.index == 0 and final is not None and final.audio is not None:
            message["audio"] = _audio_object(final, completion_id)
        response_choices.append(
            {
                "index": choice.index,
                "message": message,
                "logprobs": _logprobs(choice.logprobs),
                "finish_reason": choice.finish_reason
                or (final.finish_reason if final else None)
                or "stop",
            }
        )
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": engine.model_name,
        "choices": response_choices,
        "usage": usage(final, prompt, choices),
    }


async def _stream(
    request: Request,
    stream: Any,
    body: ChatCompletionRequest,
    prompt: str,
    completion_id: str,
    model: str,
) -> StreamingResponse:
    started: set[int] = set()
    finished: set[int] = set()
    wants_audio = "audio" in (body.modalities or ())

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
                "choices": choices,
                **extra,
            }
        )

    def choice(
        index: int,
        delta: dict[str, Any],
        finish: str | None,
        logprobs: Any = None,
    ) -> dict[str, Any]:
        if index not in started:
            started.add(index)
            delta = {"role": "assistant", **delta}
        if finish is not None:
            finished.add(index)
        entry = {"index": index, "delta": delta, "finish_reason": finish}
        if logprobs is not None:
            entry["logprobs"] = {"content": logprobs}
        return entry

    def chunks(output: OmniRequestOutput) -> Iterable[bytes]:
        if output.finished:
            return
        # With audio, choice 0 finishes in the last chunk, beside its audio.
        finish = None if wants_audio else output.finish_reason
        delta = {"content": output.text_delta} if output.text_delta else {}
        if delta or finish or output.logprobs is not None:
            yield chunk([choice(output.index, delta, finish, output.logprobs)])

    def tail(final: OmniRequestOutput | None) -> Iterable[bytes]:
        indices = [c.index for c in final.choices] if final else []
        for index in indices or [0]:
            if index in finished:
                continue
            delta: dict[str, Any] = {}
            if index == 0 and final is not None and final.audio is not None:
                delta["audio"] = _audio_object(final, completion_id)
            reason = final.choices[index].finish_reason if indices else None
            finish = reason or (final.finish_reason if final else None) or "stop"
            yield chunk([choice(index, delta, finish)])
        options = body.stream_options
        if options is not None and options.include_usage:
            yield chunk([], usage=usage(final, prompt, final.choices if final else []))

    return await stream_chunks(request, stream, chunks, tail)
