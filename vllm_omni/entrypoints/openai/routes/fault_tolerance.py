"""``/v1/fault_tolerance/*``: vLLM 0.34's fault-tolerance routes, per stage.

``GET /v1/fault_tolerance/status`` shows every stage's status (the server's
view: ``healthy``, ``silent``, ``diagnosing``, ``unhealthy``, ``dead``) and,
for a stage whose engine runs fault tolerance, its engine's own status entry
in vLLM's shape, its recovery window, how long it has been faulted and its
recoveries. ``POST /v1/fault_tolerance/apply`` starts an instruction at one
stage's engine, as vLLM's route does (202, then poll the status); the server
starts a ``retry`` by itself as soon as an engine is ``unhealthy``, so this
is for the other instructions and for a retry after a failed one. Errors
are the canonical envelope: a bad body 400, a stage (or a pipeline) without
fault tolerance 404, a stage not waiting for an instruction or already
recovering 409.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from vllm_omni.entrypoints.openai.protocol import FaultToleranceApplyRequest
from vllm_omni.entrypoints.openai.serving_common import engine_of, resolved
from vllm_omni.errors import VLLMNotFoundError, VLLMValidationError

__all__ = ["router"]

router = APIRouter()


@router.get("/v1/fault_tolerance/status")
async def fault_tolerance_status(request: Request) -> dict[str, Any]:
    engine = engine_of(request)
    return {
        "schema_version": 1,
        "stages": await resolved(engine.fault_tolerance_status()),
    }


@router.post("/v1/fault_tolerance/apply", status_code=202)
async def apply_fault_instruction(
    body: FaultToleranceApplyRequest, request: Request
) -> JSONResponse:
    engine = engine_of(request)
    await engine.check_health()
    stage_id = body.stage_id
    if stage_id is None:
        tolerant = [
            stage["stage_id"]
            for stage in await resolved(engine.fault_tolerance_status())
            if stage["fault_tolerance"]
        ]
        if not tolerant:
            raise VLLMNotFoundError(
                "No stage of this pipeline has an engine that runs fault tolerance."
            )
        if len(tolerant) != 1:
            raise VLLMValidationError(
                "stage_id is required: "
                f"{len(tolerant)} stages' engines run fault tolerance",
                parameter="stage_id",
            )
        stage_id = tolerant[0]
    await resolved(
        engine.apply_fault_instruction(
            stage_id, body.instruction, body.params, body.request_id
        )
    )
    return JSONResponse(
        status_code=202,
        content={
            "message": "Request accepted; poll /v1/fault_tolerance/status for updates.",
            "request_id": body.request_id,
            "stage_id": stage_id,
        },
    )
