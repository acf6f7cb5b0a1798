"""The error envelope as an OpenAPI schema, for the server's ``/openapi.json``.

Documentation only: the pydantic models here describe what
``vllm_omni.errors.render`` produces, so API clients and contract fuzzers
(schemathesis) know every error status a route can answer and the exact
body shape. Nothing renders through these models.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ERROR_RESPONSES", "ErrorEnvelope", "ErrorObject"]


class ErrorObject(BaseModel):
    """The canonical error object; ``code`` equals the HTTP status."""

    model_config = ConfigDict(extra="forbid")

    message: str
    type: str
    param: str | None
    code: int
    request_id: str | None = None
    stage_id: int | None = None
    error_stage_id: int | None = Field(
        None,
        deprecated="0.30's name of stage_id; removed in the next release",
        description="Equal to stage_id.",
    )


class ErrorEnvelope(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error: ErrorObject


# Statuses any API route may answer with: the client and server statuses of
# the status table, plus 401 from the API-key check.
_ROUTE_STATUSES = (400, 401, 404, 409, 422, 500, 501, 503, 504)

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorEnvelope, "description": HTTPStatus(status).phrase}
    for status in _ROUTE_STATUSES
}
