"""``GET /v1/models``: the one model this server serves."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request

from vllm_omni.entrypoints.openai.serving_common import engine_of

__all__ = ["router"]

router = APIRouter()
_STARTED = int(time.time())


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    engine = engine_of(request)
    return {
        "object": "list",
        "data": [
            {
                "id": engine.model_name,
                "object": "model",
                "created": _STARTED,
                "owned_by": "vllm-omni",
                "modalities": sorted(engine.modalities),
            }
        ],
    }
