"""The error envelope as an OpenAPI schema, for the server's ``/openapi.json``.

Documentation only: the pydantic models here describe what
``vllm_omni.errors.render`` produces, so API clients and contract fuzzers
(schemathesis) know every error status a route can answer and the exact
body shape, and the soak checks every error it sees against the served
document. ``ErrorEventObject`` is the object where no header can carry the
retry guidance (an SSE error event, a WebSocket ``error`` event, a failed
job). Nothing renders through these models.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

__all__ = [
    "ERROR_RESPONSES",
    "ErrorEnvelope",
    "ErrorEventEnvelope",
    "ErrorEventObject",
    "ErrorObject",
    "component_schemas",
]


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
    """An HTTP error response's body."""

    model_config = ConfigDict(extra="forbid")

    error: ErrorObject


class ErrorEventObject(ErrorObject):
    """The error object of an SSE error event, a WebSocket ``error`` event
    and a failed video job: the HTTP one plus the retry guidance that an
    HTTP error carries in ``x-should-retry``."""

    retryable: bool = Field(
        description="Whether repeating the same request can succeed."
    )


class ErrorEventEnvelope(BaseModel):
    """``data: {"error": ...}`` in an SSE stream that already sent 200."""

    model_config = ConfigDict(extra="forbid")

    error: ErrorEventObject


def component_schemas() -> dict[str, Any]:
    """The JSON schemas of the envelopes, keyed for ``components.schemas``."""
    _, schemas = models_json_schema(
        [(ErrorEnvelope, "serialization"), (ErrorEventEnvelope, "serialization")],
        ref_template="#/components/schemas/{model}",
    )
    defs: dict[str, Any] = schemas["$defs"]
    return defs


# Statuses any API route may answer with: the client and server statuses of
# the status table, plus 401 from the API-key check.
_ROUTE_STATUSES = (400, 401, 404, 409, 422, 500, 501, 503, 504)

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorEnvelope, "description": HTTPStatus(status).phrase}
    for status in _ROUTE_STATUSES
}
