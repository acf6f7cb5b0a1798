"""Chat and completions over the pipeline's text stage (the routes call
``chat`` and ``completion``).

Owns the steps between a validated request and the engine, the same for
both APIs but for their order of checks: which stage honours the request,
refusing what it does not honour or know, the parameters
the stage reads; then the answer, whole or as an SSE stream whose first
output is awaited before the 200 goes out (docs/design.md §4). How each API words
its choices is one small class each (``_Chat``, ``_Completion``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import StreamingResponse

from vllm_omni.entrypoints.openai.fields import check_fields
from vllm_omni.entrypoints.openai.openapi import check_body
from vllm_omni.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    UpstreamChatCompletionRequest,
    UpstreamCompletionRequest,
)
from vllm_omni.entrypoints.openai.serving_common import (
    check_model,
    check_prompt,
    engine_of,
    request_id_of,
)
from vllm_omni.errors import OmniServiceUnavailableError, VLLMValidationError
from vllm_omni.errors.http import stream_error_details
from vllm_omni.errors.render import sse_error_events
from vllm_omni.outputs import OmniRequestOutput, TextChoice

if TYPE_CHECKING:
    from vllm_omni.config import StageConfig
    from vllm_omni.entrypoints.async_omni import AsyncOmni

__all__ = ["chat", "completion"]

TextRequest = ChatCompletionRequest | CompletionRequest


async def chat(
    request: Request, body: ChatCompletionRequest
) -> dict[str, Any] | StreamingResponse:
    """``POST /v1/chat/completions``; the request's own checks ran on its
    model (``protocol.py``): here the engine, the messages' text (a non-text
    part is a 400 even without a text stage), the stage's fields and the
    document's ranges."""
    engine = await _engine(request, body)
    raw = await request.json()
    prompt = _chat_prompt(raw.get("messages") or [], engine.stage_for("text"))
    check_prompt(request, prompt, "messages")
    stage = _checked_stage(request, engine, "chat", body)
    await check_body(request, "chat", raw)
    params = _stage_params(
        _Chat, body, raw, stage, max_completion_tokens=body.max_completion_tokens
    )
    voice = body.talker_voice()
    if voice is not None:
        params["voice"] = voice
    modalities = body.output_modalities()
    return await _answer(request, engine, _Chat, body, prompt, modalities, params)


async def completion(
    request: Request, body: CompletionRequest
) -> dict[str, Any] | StreamingResponse:
    """``POST /v1/completions``: the engine, the stage's fields, the prompt,
    the document's ranges."""
    engine = await _engine(request, body)
    stage = _checked_stage(request, engine, "completions", body)
    prompt = body.single_prompt()
    check_prompt(request, prompt, "prompt")
    raw = await request.json()
    await check_body(request, "completions", raw)
    params = _stage_params(_Completion, body, raw, stage)
    return await _answer(request, engine, _Completion, body, prompt, ["text"], params)


# -- before the engine ---------------------------------------------------------------


async def _engine(request: Request, body: TextRequest) -> AsyncOmni:
    """The engine, healthy, serving the model the request names."""
    engine = engine_of(request)
    await engine.check_health()
    check_model(engine, body.model)
    return engine


def _checked_stage(
    request: Request, engine: AsyncOmni, route: str, body: TextRequest
) -> StageConfig:
    """The stage that generates the text (``text`` or ``vllm``), or a 503;
    the fields it does not honour (or does not know) refused."""
    stage = engine.stage_for("text")
    if stage is None:
        raise OmniServiceUnavailableError(
            "The pipeline has no text stage; this route is unavailable."
        )
    check_fields(route, body, [stage])
    return stage


def _chat_prompt(messages: list[Any], stage: StageConfig | None) -> str:
    """The messages' text (what the guardrail and the reference stage read).

    A content part that is not text is a 400 on that part unless a ``vllm``
    stage renders it.
    """
    parts: list[str] = []
    for i, message in enumerate(messages):
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
                    parameter=f"messages.{i}.content.{j}",
                )
    prompt = "\n".join(p for p in parts if p)
    if not prompt.strip():
        raise VLLMValidationError("messages must contain text", parameter="messages")
    return prompt


def _stage_params(
    api: type[_Shape],
    body: TextRequest,
    raw: dict[str, Any],
    stage: StageConfig,
    **sampling: Any,
) -> dict[str, Any]:
    """What the text stage reads: a ``vllm`` stage the request itself, the
    reference text stage its few fields (``sampling``: the API's own, after
    ``max_tokens``)."""
    if stage.kind == "vllm":
        params: dict[str, Any] = {
            "openai": {"api": api.api, "request": _upstream_json(raw, api.upstream)}
        }
        if body.lora is not None:
            params["lora"] = body.lora
        return params
    # Each under its own name, so the stage's 400 names the one given.
    given = (
        ("max_tokens", body.max_tokens),
        *sampling.items(),
        ("temperature", body.temperature),
        ("seed", body.seed),
        ("stop", body.stop or None),
        ("n", body.n if body.n != 1 else None),
    )
    return {name: value for name, value in given if value is not None}


def _upstream_json(raw: dict[str, Any], model: type[BaseModel]) -> str:
    """The fields of the client's JSON that upstream's ``model`` defines, as
    JSON for a ``vllm`` stage to read with that model (the OpenAI API's
    fields upstream lacks and vLLM-Omni's own stay behind)."""
    names = set(model.model_fields) | {
        field.alias for field in model.model_fields.values() if field.alias
    }
    return json.dumps({key: value for key, value in raw.items() if key in names})


# -- the answer ----------------------------------------------------------------------


class _Shape(ABC):
    """How one API words its choices, whole and streamed; one per answer."""

    api: ClassVar[str]  # the API a ``vllm`` stage reads the request as
    upstream: ClassVar[type[BaseModel]]
    id_prefix: ClassVar[str]
    object: ClassVar[str]
    chunk_object: ClassVar[str]

    def __init__(self, completion_id: str, modalities: list[str]) -> None:
        self.completion_id = completion_id

    @abstractmethod
    def choice(
        self, choice: TextChoice, final: OmniRequestOutput | None
    ) -> dict[str, Any]:
        """A choice of the whole answer, but its ``finish_reason``."""

    def finish(self, output: OmniRequestOutput) -> str | None:
        """The ``finish_reason`` a streamed output's chunk carries."""
        return output.finish_reason

    @abstractmethod
    def delta(
        self, index: int, text: str, finish: str | None, logprobs: Any = None
    ) -> dict[str, Any]:
        """A streamed choice."""

    def last(
        self, index: int, final: OmniRequestOutput | None, finish: str
    ) -> dict[str, Any]:
        """The streamed choice that finishes ``index`` after the last output."""
        return self.delta(index, "", finish)

    def unopened(self, index: int) -> bool:
        """Whether ``index``'s first streamed chunk is still to come."""
        return False


class _Chat(_Shape):
    api = "chat"
    upstream = UpstreamChatCompletionRequest
    id_prefix = "chatcmpl"
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, completion_id: str, modalities: list[str]) -> None:
        super().__init__(completion_id, modalities)
        self.started: set[int] = set()
        self.wants_audio = "audio" in modalities

    def choice(
        self, choice: TextChoice, final: OmniRequestOutput | None
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": choice.text}
        if choice.index == 0 and final is not None and final.audio is not None:
            message["audio"] = self._audio(final)
        logprobs = None if choice.logprobs is None else {"content": choice.logprobs}
        return {"index": choice.index, "message": message, "logprobs": logprobs}

    def finish(self, output: OmniRequestOutput) -> str | None:
        # With audio, choice 0 finishes in the last chunk, beside its audio.
        return None if self.wants_audio else output.finish_reason

    def unopened(self, index: int) -> bool:
        # The role chunk goes out with the choice's first output, text or not
        # (an empty text before audio would otherwise say nothing until the
        # talker is done), as upstream's stream opens with it.
        return index not in self.started

    def delta(
        self, index: int, text: str, finish: str | None, logprobs: Any = None
    ) -> dict[str, Any]:
        return self._delta(index, {"content": text} if text else {}, finish, logprobs)

    def last(
        self, index: int, final: OmniRequestOutput | None, finish: str
    ) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if index == 0 and final is not None and final.audio is not None:
            delta["audio"] = self._audio(final)
        return self._delta(index, delta, finish)

    def _delta(
        self,
        index: int,
        delta: dict[str, Any],
        finish: str | None,
        logprobs: Any = None,
    ) -> dict[str, Any]:
        if index not in self.started:
            self.started.add(index)
            delta = {"role": "assistant", **delta}
        entry = {"index": index, "delta": delta, "finish_reason": finish}
        if logprobs is not None:
            entry["logprobs"] = {"content": logprobs}
        return entry

    def _audio(self, output: OmniRequestOutput) -> dict[str, Any]:
        return {
            "id": f"audio-{self.completion_id}",
            "data": base64.b64encode(output.audio or b"").decode(),
            "transcript": output.text,
            "expires_at": int(time.time()) + 3600,
        }


class _Completion(_Shape):
    api = "completion"
    upstream = UpstreamCompletionRequest
    id_prefix = "cmpl"
    object = "text_completion"
    chunk_object = "text_completion"

    def choice(
        self, choice: TextChoice, final: OmniRequestOutput | None
    ) -> dict[str, Any]:
        return {"index": choice.index, "text": choice.text, "logprobs": choice.logprobs}

    def delta(
        self, index: int, text: str, finish: str | None, logprobs: Any = None
    ) -> dict[str, Any]:
        return {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish,
        }


async def _answer(
    request: Request,
    engine: AsyncOmni,
    api: type[_Shape],
    body: TextRequest,
    prompt: str,
    modalities: list[str],
    params: dict[str, Any],
) -> dict[str, Any] | StreamingResponse:
    request_id = request_id_of(request)
    shape = api(f"{api.id_prefix}-{request_id}", modalities)
    stream = engine.generate(
        prompt,
        request_id=request_id,
        modalities=modalities,
        params=params,
        sampling_params_list=body.sampling_params_list,
        # The client's traceparent, as ``vllm serve`` passes it to its engine.
        trace_headers=request.headers,
    )
    if body.stream:
        return await _stream(request, stream, shape, body, prompt, engine.model_name)

    async with contextlib.aclosing(stream) as outputs:
        final: OmniRequestOutput | None = None
        async for output in outputs:
            final = output
    choices = (final.choices if final else None) or [TextChoice(index=0)]
    return {
        "id": shape.completion_id,
        "object": shape.object,
        "created": int(time.time()),
        "model": engine.model_name,
        "choices": [
            {
                **shape.choice(choice, final),
                "finish_reason": _finish_reason(choice.finish_reason, final),
            }
            for choice in choices
        ],
        "usage": _usage(final, prompt, choices),
    }


def _finish_reason(reason: str | None, final: OmniRequestOutput | None) -> str:
    return reason or (final.finish_reason if final else None) or "stop"


def _usage(
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


# -- the stream ----------------------------------------------------------------------


async def _stream(
    request: Request,
    stream: AsyncGenerator[OmniRequestOutput, None],
    shape: _Shape,
    body: TextRequest,
    prompt: str,
    model: str,
) -> StreamingResponse:
    finished: set[int] = set()

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return _sse(
            {
                "id": shape.completion_id,
                "object": shape.chunk_object,
                "created": int(time.time()),
                "model": model,
                "choices": choices,
                **extra,
            }
        )

    def chunks(output: OmniRequestOutput) -> Iterable[bytes]:
        if output.finished:
            return
        finish = shape.finish(output)
        if (
            output.text_delta
            or finish
            or output.logprobs is not None
            or shape.unopened(output.index)
        ):
            if finish is not None:
                finished.add(output.index)
            delta = shape.delta(
                output.index, output.text_delta, finish, output.logprobs
            )
            yield chunk([delta])

    def tail(final: OmniRequestOutput | None) -> Iterable[bytes]:
        indices = [c.index for c in final.choices] if final else []
        for index in indices or [0]:
            if index in finished:
                continue
            reason = final.choices[index].finish_reason if final and indices else None
            yield chunk([shape.last(index, final, _finish_reason(reason, final))])
        options = body.stream_options
        if options is not None and options.include_usage:
            yield chunk([], usage=_usage(final, prompt, final.choices if final else []))

    return await _stream_chunks(request, stream, chunks, tail)


def _sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


async def _stream_chunks(
    request: Request,
    stream: AsyncGenerator[OmniRequestOutput, None],
    chunks: Callable[[OmniRequestOutput], Iterable[bytes]],
    tail: Callable[[OmniRequestOutput | None], Iterable[bytes]],
) -> StreamingResponse:
    """An SSE response of ``chunks(output)`` for every output, then ``tail``
    (given the final output) and ``[DONE]``. The first output is awaited
    here, before any byte is sent: a failure so far propagates to the error
    boundary as an ordinary HTTP error. After that, a failure is one error
    event, then ``[DONE]``. A client that goes away cancels the body: closing
    the engine stream aborts the request in every stage, not an error."""
    try:
        first = await anext(stream)
    except StopAsyncIteration:
        first = None
    except BaseException:
        await stream.aclose()
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
            await stream.aclose()

    return StreamingResponse(body(), media_type="text/event-stream")
