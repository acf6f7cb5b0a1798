"""``GET /health``: 200 while the engine runs; 503 once it is dead, and while
a stage's engine is faulted (vLLM 0.34's fault tolerance) with the refusal a
request for that stage gets (the faulted record: its ``stage_id``, a
``Retry-After``), so that a load balancer routes elsewhere until it recovers."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from vllm_omni.entrypoints.openai.serving_common import engine_of, resolved
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
    await resolved(engine.check_faulted())
    return Response(status_code=200)
