"""``WS /v1/realtime``: a minimal, OpenAI-Realtime-like session over the engine.

The handshake is refused, before accept, with the canonical status (401,
503 without a text stage, the dead engine's 500); the session itself is
``serving_realtime.RealtimeSession``. Events and errors: docs/serving.md,
"Realtime"; docs/design.md §4 (WebSocket).
"""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from vllm_omni.entrypoints.openai.serving_common import engine_of, require_modality
from vllm_omni.entrypoints.openai.serving_realtime import RealtimeSession

__all__ = ["router"]

router = APIRouter()


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket) -> None:
    engine = engine_of(websocket)
    await engine.check_health()
    require_modality(engine, "text")
    await RealtimeSession(websocket, engine).run()
