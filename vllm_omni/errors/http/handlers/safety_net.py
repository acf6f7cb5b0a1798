"""The last resort: a failure in middleware outside the boundary.

Starlette sends a handler for ``Exception`` to ``ServerErrorMiddleware``,
outside every user middleware; whatever reaches it (an instrumentator or
CORS failure) still gets the canonical envelope and a request id. Route
failures never get here: the boundary renders them first.
"""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response

from vllm_omni.errors.http.reporting import details_for_exception
from vllm_omni.errors.http.request_ids import request_id_of
from vllm_omni.errors.render import http_error_response

__all__ = ["handle_any_exception"]


async def handle_any_exception(request: Request, exc: Exception) -> Response:
    """Last resort for failures in middleware outside the boundary."""
    details = details_for_exception(exc, request_id=request_id_of(request))
    return http_error_response(details)
