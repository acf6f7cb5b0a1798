"""``POST /v1/completions``: text completion, plain or streamed (SSE).

The request is upstream vLLM's own ``CompletionRequest`` (imported, with
vLLM-Omni's ``lora`` added), validated as vLLM validates it; each field the
client sets is honoured or refused with a 400 naming it (``fields.py``),
exactly as on chat. A ``vllm`` stage receives the request itself and
renders and samples it with upstream's code; the reference ``text`` stage
honours the fields it implements. The error contract is chat's: statuses
before the first byte, one SSE error event after it, the request id, and
an abort in every stage when the client goes away.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import StreamingResponse

from vllm_omni.config import StageConfig
from vllm_omni.entrypoints.openai.openapi import check_body
from vllm_omni.entrypoints.openai.protocol import (
    CompletionRequest,
    UpstreamCompletionRequest,
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


def _params(
    body: CompletionRequest, raw: dict[str, Any], stage: StageConfig
) -> dict[str, Any]:
    """What the text stage reads: a ``vllm`` stage the request itself, the
    reference text stage its few fields."""
    if stage.kind == "vllm":
        params: dict[str, Any] = {
            "openai": {
                "api": "completion",
                "request": upstream_json(raw, UpstreamCompletionRequest),
            }
        }
        if body.lora is not None:
            params["lora"] = body.lora
        return params
    return {
        name: value
        for name, value in (
            ("max_tokens", body.max_tokens),
            ("temperature", body.temperature),
            ("seed", body.seed),
            ("stop", body.stop or None),
            ("n", body.n if body.n != 1 else None),
        )
        if value is not None
    }


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
    engine = engine_of(request)
    await engine.check_health()
    check_model(engine, body.model)
    stage = text_stage(engine)
    check_request(request, "completions", body, stage)
    prompt = body.prompt if isinstance(body.prompt, str) else None
    if isinstance(body.prompt, list) and len(body.prompt) == 1:
        prompt = body.prompt[0]
    if not isinstance(prompt, str):
        raise VLLMValidationError("prompt must be a string", parameter="prompt")
    check_prompt(request, prompt, "prompt")
    raw = await request.json()
    await check_body(request, "completions", raw)
    request_id = request_id_of(request)
    completion_id = f"cmpl-{request_id}"
    stream = engine.generate(
        prompt,
        request_id=request_id,
        modalities=["text"],
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
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": engine.model_name,
        "choices": [
            {
                "index": choice.index,
                "text": choice.text,
                "logprobs": choice.logprobs,
                "finish_reason": choice.finish_reason
                or (final.finish_reason if final else None)
                or "stop",
            }
            for choice in choices
        ],
        "usage": usage(final, prompt, choices),
    }


async def _stream(
    request: Request,
    stream: Any,
    body: CompletionRequest,
    prompt: str,
    completion_id: str,
    model: str,
) -> StreamingResponse:
    finished: set[int] = set()

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse(
            {
                "id": completion_id,
                "object": "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": choices,
                **extra,
            }
        )

    def choice(
        index: int, text: str, finish: str | None, logprobs: Any = None
    ) -> dict[str, Any]:
        if finish is not None:
            finished.add(index)
        return {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish,
        }

    def chunks(output: OmniRequestOutput) -> Iterable[bytes]:
        if output.finished:
            return
        if output.text_delta or output.finish_reason or output.logprobs is not None:
            yield chunk(
                [
                    choice(
                        output.index,
                        output.text_delta,
                        output.finish_reason,
                        output.logprobs,
                    )
                ]
            )

    def tail(final: OmniRequestOutput | None) -> Iterable[bytes]:
        indices = [c.index for c in final.choices] if final else []
        for index in indices or [0]:
            if index not in finished:
                reason = final.choices[index].finish_reason if indices else None
                finish = reason or (final.finish_reason if final else None) or "stop"
                yield chunk([choice(index, "", finish)])
        options = body.stream_options
        if options is not None and options.include_usage:
            yield chunk([], usage=usage(final, prompt, final.choices if final else []))

    return await stream_chunks(request, stream, chunks, tail)
