"""What the two text-generation routes share: chat and completions.

Owns the steps between a validated OpenAI request and the engine that both
routes take the same way: which stage honours the request (``text_stage``),
refusing what it does not honour and logging vendor extras
(``check_request``), the parameters a stage reads (``stage_params``), the
usage block, and the SSE stream whose first output is awaited before the
200 goes out (DESIGN §4). Chunk shapes stay in the route modules.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import StreamingResponse

from vllm_omni.entrypoints.openai.fields import check_fields, log_ignored
from vllm_omni.entrypoints.openai.routes.common import request_id_of
from vllm_omni.errors import OmniServiceUnavailableError
from vllm_omni.errors.http import stream_error_details
from vllm_omni.errors.render import sse_error_events
from vllm_omni.outputs import OmniRequestOutput, TextChoice

if TYPE_CHECKING:
    from vllm_omni.config import StageConfig
    from vllm_omni.entrypoints.async_omni import AsyncOmni

__all__ = [
    "check_request",
    "sse",
    "stream_chunks",
    "text_stage",
    "upstream_json",
    "usage",
]


def text_stage(engine: AsyncOmni) -> StageConfig:
    """The stage that generates the text (``text`` or ``vllm``), or a 503."""
    stage = engine.stage_for("text")
    if stage is None:
        raise OmniServiceUnavailableError(
            "The pipeline has no text stage; this route is unavailable."
        )
    return stage


def check_request(
    request: Request, route: str, body: BaseModel, stage: StageConfig
) -> None:
    """Refuse the fields ``stage`` does not honour; log the vendor extras."""
    check_fields(route, body, [stage])
    log_ignored(request_id_of(request), (body.model_extra or {}).keys())


def upstream_json(raw: dict[str, Any], model: type[BaseModel]) -> str:
    """The fields of the client's JSON that upstream's ``model`` defines, as
    JSON for a ``vllm`` stage to read with that model (vendor extras and
    vLLM-Omni's own fields stay behind)."""
    names = set(model.model_fields) | {
        field.alias for field in model.model_fields.values() if field.alias
    }
    return json.dumps({key: value for key, value in raw.items() if key in names})


def usage(
    final: OmniRequestOutput | None, prompt: str, choices: Iterable[TextChoice]
) -> dict[str, int]:
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
        completion_tokens = sum(len(choice.text.split()) for choice in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


async def stream_chunks(
    request: Request,
    stream: AsyncIterator[OmniRequestOutput],
    chunks: Callable[[OmniRequestOutput], Iterable[bytes]],
    tail: Callable[[OmniRequestOutput | None], Iterable[bytes]],
) -> StreamingResponse:
    """An SSE response of ``chunks(output)`` for every output, then ``tail``
    (given the final output) and ``[DONE]``. The first output is awaited
    here, before any byte is sent: a failure so far propagates to the error
    boundary as an ordinary HTTP error. After that, a failure is one error
    event, then ``[DONE]``."""
    try:
        first = await anext(stream)
    except StopAsyncIteration:
        first = None
    except BaseException:
        await stream.aclose()  # type: ignore[attr-defined]
        raise

    async def body() -> AsyncIterator[bytes]:
        final: OmniRequestOutput | None = None
        try:
            if first is not None:
                for chunk in chunks(first):
                    yield chunk
                final = first
                async for output in stream:
                    for chunk in chunks(output):
                        yield chunk
                    final = output
                    # Queued outputs never suspend: without this checkpoint a
                    # client that hung up is noticed only after the whole
                    # stream went to a dead socket (and other requests wait).
                    await asyncio.sleep(0)
            for chunk in tail(final):
                yield chunk
            yield b"data: [DONE]\n\n"
        except Exception as exc:
            yield sse_error_events(stream_error_details(request, exc))
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    return StreamingResponse(body(), media_type="text/event-stream")
