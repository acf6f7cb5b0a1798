"""``GET /health``: 200 while the engine runs; 503 once it is dead, and while
a stage's engine is faulted (vLLM 0.34's fault tolerance), naming the stage,
so that a load balancer routes elsewhere until it recovers."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from vllm_omni.entrypoints.openai.serving_common import engine_of
from vllm_omni.errors import OmniServiceUnavailableError

__all__ = ["PUBLIC", "router"]

# Load balancers probe without credentials.
PUBLIC = True
router = APIRouter()


@router.get("/health", response_class=Response)
async def health(request: Request) -> Response:
    engine = engine_of(request)
    if engine.errored or not engine.is_running:
        raise OmniServiceUnavailableError("The engine is not running.")
    faulted = engine.faulted_stages()
    if faulted:
        stage = faulted[0]
        raise OmniServiceUnavailableError(
            f"Stage {stage.id} ({stage.name}) has faulted and is recovering.",
            stage_id=stage.id,
        )
    return Response(status_code=200)
