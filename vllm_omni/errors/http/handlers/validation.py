"""Request validation failures: a 400 naming the first offending field.

Owns turning pydantic's errors into one ``VLLMValidationError`` whose
``param`` is the field, written as vLLM writes it (``messages.0.content``:
no union member, no pydantic marker), and whose message lists at most a
few distinct errors. Must never echo the
client's input. Runs inside ``ExceptionMiddleware``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response
from vllm.entrypoints.serve.exception_handling.handlers.validation import (
    clean_loc_for_param,
)

from vllm_omni.errors.http.reporting import details_for_exception, error_mode
from vllm_omni.errors.http.request_ids import request_id_of
from vllm_omni.errors.render import http_error_response
from vllm_omni.errors.sanitize import sanitize_parameter
from vllm_omni.errors.types import VLLMValidationError

__all__ = ["handle_validation_error"]

_MAX_VALIDATION_ITEMS = 5
# A union member's name in a location: a class name (CamelCase), which no
# field of the OpenAI API is.
_CLASS = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)*")


def _validation_exception(exc: RequestValidationError) -> VLLMValidationError:
    """A 400 that names the first offending field and never echoes input."""
    errors = exc.errors()
    parameter: str | None = None
    parts: list[str] = []
    for error in errors:
        ctx_error = (error.get("ctx") or {}).get("error")
        # A JSON syntax error's location is a byte offset, not a field.
        field = (
            "body"
            if error.get("type") == "json_invalid"
            else _field_path(error.get("loc", ()))
        )
        if parameter is None:
            if isinstance(ctx_error, VLLMValidationError):
                parameter = ctx_error.parameter
            else:
                parameter = sanitize_parameter(field)
        # A union's members fail the same field the same way: said once.
        part = f"{field}: {error.get('msg', 'invalid value')}"
        if part not in parts:
            parts.append(part)
    shown = parts[:_MAX_VALIDATION_ITEMS]
    if len(parts) > _MAX_VALIDATION_ITEMS:
        shown.append(f"and {len(parts) - _MAX_VALIDATION_ITEMS} more")
    message = "Invalid request: " + "; ".join(shown) if shown else "Invalid request."
    return VLLMValidationError(message, parameter=parameter)


def _field_path(loc: Sequence[Any]) -> str:
    """pydantic's error location as the field's path, as vLLM writes a
    ``param``: dotted, a list index as a segment (``messages.0.content``),
    without vLLM's leading ``body``. vLLM's ``clean_loc_for_param`` drops
    pydantic's internal markers (``str``, ``list[str]``,
    ``function-wrap[...]``); a union member's class name
    (``ChatCompletionDeveloperMessageParam``) is no field either, so it goes
    too."""
    kept = tuple(
        part
        for part in loc
        if part != "body" and not (isinstance(part, str) and _CLASS.fullmatch(part))
    )
    return clean_loc_for_param(kept) if kept else "body"


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
