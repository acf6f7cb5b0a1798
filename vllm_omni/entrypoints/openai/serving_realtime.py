"""A realtime session over the engine: its client events read and checked,
its responses run one at a time, each failure ended as docs/serving.md
"Realtime" says (one error event; a failed response also closes).

It builds no statuses or error objects: it normalizes through
``stream_error_details`` and sends what ``vllm_omni.errors.render`` returns.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from vllm_omni.entrypoints.openai.fields import check_fields
from vllm_omni.entrypoints.openai.serving_common import check_prompt, request_id_of
from vllm_omni.entrypoints.openai.unicode import non_unicode_error
from vllm_omni.entrypoints.sampling_params_list import PARAMETER, per_stage_params
from vllm_omni.errors import VLLMValidationError, sanitize_request_id
from vllm_omni.errors.http import stream_error_details
from vllm_omni.errors.render import ws_close_code, ws_error_event
from vllm_omni.errors.text import non_unicode_field

if TYPE_CHECKING:
    from vllm_omni.entrypoints.async_omni import AsyncOmni
    from vllm_omni.outputs import OmniRequestOutput

__all__ = ["RealtimeSession"]

_EVENT_TYPES = ("response.create",)
_MODALITY_SETS = (frozenset({"text"}), frozenset({"text", "audio"}))
_INT64 = (-(2**63), 2**63 - 1)
# Frames read ahead while a response runs; beyond this the reader waits.
_INBOX_SIZE = 64


@dataclass(frozen=True, slots=True)
class _ResponseCreate:
    event_id: str | None
    instructions: str
    modalities: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict)
    sampling_params_list: Any = None


def _decode(frame: str | bytes) -> dict[str, Any]:
    if not isinstance(frame, str):
        raise VLLMValidationError("Events must be JSON text frames.")
    try:
        event = json.loads(frame)
    except (ValueError, RecursionError):
        # Only the client's frame is parsed here: not JSON, an integer past
        # the digit limit, or nested too deep.
        event = None
    if not isinstance(event, dict):
        raise VLLMValidationError("An event must be a JSON object.")
    return event


def _event_id(event: dict[str, Any]) -> str | None:
    event_id = event.get("event_id")
    if event_id is not None and sanitize_request_id(event_id) is None:
        raise VLLMValidationError(
            "event_id must be a short token (letters, digits, '._:-')",
            parameter="event_id",
        )
    return event_id


def _response_create(event: dict[str, Any], event_id: str | None) -> _ResponseCreate:
    kind = event.get("type")
    if not isinstance(kind, str):
        raise VLLMValidationError("Every event needs a string type.", parameter="type")
    if kind not in _EVENT_TYPES:
        raise VLLMValidationError(
            f"Unknown event type; supported: {', '.join(_EVENT_TYPES)}.",
            parameter="type",
        )
    response = event.get("response")
    if not isinstance(response, dict):
        raise VLLMValidationError("response must be an object", parameter="response")
    instructions = response.get("instructions")
    if not isinstance(instructions, str) or not instructions.strip():
        raise VLLMValidationError(
            "instructions must be a non-empty string",
            parameter="response.instructions",
        )
    modalities = response.get("modalities", ["text"])
    if (
        not isinstance(modalities, list)
        or not all(isinstance(m, str) for m in modalities)
        or frozenset(modalities) not in _MODALITY_SETS
    ):
        raise VLLMValidationError(
            'modalities must be ["text"] or ["text", "audio"]',
            parameter="response.modalities",
        )
    params: dict[str, Any] = {}
    for name, types, described in (
        ("max_tokens", (int,), "a 64-bit integer"),
        ("temperature", (int, float), "a number"),
        ("voice", (str,), "a string"),
    ):
        value = response.get(name)
        if value is None:
            continue
        # The stage checks the range; the stage wire carries 64-bit integers.
        if (
            isinstance(value, bool)
            or not isinstance(value, types)
            or (isinstance(value, int) and not _INT64[0] <= value <= _INT64[1])
        ):
            raise VLLMValidationError(
                f"{name} must be {described}", parameter=f"response.{name}"
            )
        params[name] = value
    ordered = tuple(m for m in ("text", "audio") if m in modalities)
    entries = response.get(PARAMETER)
    return _ResponseCreate(event_id, instructions, ordered, params, entries)


def _check_entries(engine: AsyncOmni, entries: Any) -> None:
    """The per-stage list checked before the response starts, its mistakes
    named within the event (``response.sampling_params_list.1.voice``)."""
    try:
        per_stage_params(engine.config.stages, entries)
    except VLLMValidationError as exc:
        raise VLLMValidationError(
            f"response.{exc.args[0] if exc.args else exc}",
            parameter=f"response.{getattr(exc, 'parameter', None) or PARAMETER}",
        ) from None


class RealtimeSession:
    """One accepted connection: a reader task feeding an inbox, one response
    at a time, and the rules for how each kind of failure ends."""

    def __init__(self, websocket: WebSocket, engine: AsyncOmni) -> None:
        self._ws = websocket
        self._engine = engine
        # The engine request id of every response: responses never overlap.
        self._id = request_id_of(websocket)
        self._inbox: asyncio.Queue[str | bytes | None] = asyncio.Queue(_INBOX_SIZE)

    async def run(self) -> None:
        await self._ws.accept()
        reader = asyncio.create_task(self._read(), name=f"realtime-read-{self._id}")
        try:
            await self._ws.send_json(
                {
                    "type": "session.created",
                    "session": {
                        "id": self._id,
                        "object": "realtime.session",
                        "model": self._engine.model_name,
                        "modalities": [
                            m for m in ("text", "audio") if m in self._engine.modalities
                        ],
                    },
                }
            )
            while (frame := await self._inbox.get()) is not None:
                request = await self._parse(frame)
                if request is not None and not await self._respond(request, reader):
                    return
        except WebSocketDisconnect:
            return
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read(self) -> None:
        """Feed client frames to the inbox; ``None`` marks the disconnect."""
        try:
            while True:
                message = await self._ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                text, data = message.get("text"), message.get("bytes")
                await self._inbox.put(text if text is not None else data or b"")
        except (WebSocketDisconnect, RuntimeError):
            return
        finally:
            # Nobody is left to answer what is still queued.
            while not self._inbox.empty():
                self._inbox.get_nowait()
            self._inbox.put_nowait(None)

    async def _parse(self, frame: str | bytes) -> _ResponseCreate | None:
        """The request a frame asks for, or ``None`` after its error event."""
        event_id: str | None = None
        try:
            event = _decode(frame)
            event_id = _event_id(event)
            found = non_unicode_field(event)
            if found is not None:
                raise non_unicode_error(found, "event")
            request = _response_create(event, event_id)
            check_prompt(self._ws, request.instructions, "response.instructions")
            stages = [self._engine.stage_for(m) for m in request.modalities]
            check_fields(
                "realtime",
                event["response"],
                [stage for stage in stages if stage is not None],
                prefix="response.",
            )
            if request.sampling_params_list is not None:
                _check_entries(self._engine, request.sampling_params_list)
            return request
        except VLLMValidationError as exc:
            details = stream_error_details(self._ws, exc)
            await self._ws.send_json(ws_error_event(details, event_id=event_id))
            return None

    async def _respond(
        self, request: _ResponseCreate, reader: asyncio.Task[None]
    ) -> bool:
        """Run one response; ``False`` when the session is over."""
        response = asyncio.create_task(self._stream(request))
        try:
            await asyncio.wait({response, reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not response.done():
                # The client left: closing generate() aborts it in every stage.
                response.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await response
        return not response.cancelled() and response.result()

    async def _stream(self, request: _ResponseCreate) -> bool:
        response_id = f"resp_{uuid.uuid4().hex}"
        summary = {
            "id": response_id,
            "object": "realtime.response",
            "status": "in_progress",
            "modalities": list(request.modalities),
        }
        try:
            await self._ws.send_json({"type": "response.created", "response": summary})
            final = None
            stream = self._engine.generate(
                request.instructions,
                request_id=self._id,
                modalities=request.modalities,
                params=request.params,
                sampling_params_list=request.sampling_params_list,
            )
            async with contextlib.aclosing(stream) as outputs:
                async for output in outputs:
                    if output.text_delta:
                        await self._ws.send_json(
                            {
                                "type": "response.text.delta",
                                "response_id": response_id,
                                "delta": output.text_delta,
                            }
                        )
                        # A send to a client that keeps reading never waits,
                        # nor does the next output of an engine that is
                        # ahead: without this turn the reader, which hears a
                        # hang-up, would wait until the whole response went
                        # to a client that is gone (and other sessions too).
                        await asyncio.sleep(0)
                    if output.finished:
                        final = output
            await self._finish(response_id, summary, final)
            return True
        except WebSocketDisconnect:
            return False
        except Exception as exc:
            details = stream_error_details(self._ws, exc)
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                await self._ws.send_json(
                    ws_error_event(details, event_id=request.event_id)
                )
                await self._ws.close(code=ws_close_code(details))
            return False

    async def _finish(
        self,
        response_id: str,
        summary: dict[str, Any],
        final: OmniRequestOutput | None,
    ) -> None:
        aborted = final is None or final.finish_reason == "abort"
        if final is not None and not aborted:
            await self._ws.send_json(
                {
                    "type": "response.text.done",
                    "response_id": response_id,
                    "text": final.text,
                }
            )
            if final.audio is not None:
                await self._ws.send_json(
                    {
                        "type": "response.audio.delta",
                        "response_id": response_id,
                        "delta": base64.b64encode(final.audio).decode("ascii"),
                    }
                )
                await self._ws.send_json(
                    {"type": "response.audio.done", "response_id": response_id}
                )
        await self._ws.send_json(
            {
                "type": "response.done",
                "response": {
                    **summary,
                    "status": "cancelled" if aborted else "completed",
                    "finish_reason": None if final is None else final.finish_reason,
                },
            }
        )
