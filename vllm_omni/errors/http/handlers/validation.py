"""Request validation failures: a 400 naming the first offending field.

Owns turning pydantic's errors into one ``VLLMValidationError`` whose
``param`` is the field (the shared field when every member of a union
failed) and whose message lists at most a few errors. Must never echo the
client's input. Runs inside ``ExceptionMiddleware``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from vllm_omni.errors.http.reporting import details_for_exception, error_mode
from vllm_omni.errors.http.request_ids import request_id_of
from vllm_omni.errors.render import http_error_response
from vllm_omni.errors.sanitize import sanitize_parameter
from vllm_omni.errors.types import VLLMValidationError

__all__ = ["handle_validation_error"]

_MAX_VALIDATION_ITEMS = 5


def _validation_exception(exc: RequestValidationError) -> VLLMValidationError:
    """A 400 that names the first offending field and never echoes input."""
    errors = exc.errors()
    parameter: str | None = None
    parts: list[str] = []
    # A value that matches no member of a union fails once per member
    # (``stop.str``, ``stop.list[str]``): the field is what they share.
    shared = _shared_location(errors) if len(errors) > 1 else []
    if shared:
        parameter = sanitize_parameter(".".join(shared))
    for error in errors[:_MAX_VALIDATION_ITEMS]:
        ctx_error = (error.get("ctx") or {}).get("error")
        if parameter is None and isinstance(ctx_error, VLLMValidationError):
            parameter = ctx_error.parameter
        loc = [str(p) for p in error.get("loc", ()) if p != "body"]
        # A JSON syntax error's location is a byte offset, not a field.
        field = "body" if error.get("type") == "json_invalid" else ".".join(loc)
        field = field or "body"
        if parameter is None:
            parameter = sanitize_parameter(field)
        parts.append(f"{field}: {error.get('msg', 'invalid value')}")
    if len(errors) > _MAX_VALIDATION_ITEMS:
        parts.append(f"and {len(errors) - _MAX_VALIDATION_ITEMS} more")
    message = "Invalid request: " + "; ".join(parts) if parts else "Invalid request."
    return VLLMValidationError(message, parameter=parameter)


def _shared_location(errors: Sequence[Any]) -> list[str]:
    """The field whose union members all failed: every error's location is
    that field plus one member name; otherwise nothing."""
    locations = [
        tuple(str(p) for p in error.get("loc", ()) if p != "body") for error in errors
    ]
    fields = {location[:-1] for location in locations}
    if len(fields) != 1 or not all(len(location) >= 2 for location in locations):
        return []
    return list(next(iter(fields)))


async def handle_validation_error(
    request: Request, exc: RequestValidationError
) -> Response:
    """The canonical 400 for a request that failed validation."""
    details = details_for_exception(
        _validation_exception(exc),
        request_id=request_id_of(request),
        mode=error_mode(request.app),
    )
    return http_error_response(details)
