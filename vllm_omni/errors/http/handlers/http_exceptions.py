"""Starlette's ``HTTPException`` (404, 405, the body limit's 413, …), canonical.

Owns turning the framework's status into the semantic exception for it and
the ``Allow`` header on every 405 (every method the path accepts, not only
the first matching route's). Runs inside ``ExceptionMiddleware``.
"""

from __future__ import annotations

from fastapi import Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match

from vllm_omni.errors.details import DEFAULT_TYPE, STATUS_RANGES
from vllm_omni.errors.http.reporting import details_for_exception, error_mode
from vllm_omni.errors.http.request_ids import request_id_of
from vllm_omni.errors.render import http_error_response
from vllm_omni.errors.table import HTTP_STATUS_TYPES
from vllm_omni.errors.types import OmniClientError, OmniServerError

__all__ = ["as_semantic", "handle_http_exception"]

_DEFAULT_DETAIL = {"client": "Bad Request", "server": "Internal Server Error"}


def as_semantic(exc: StarletteHTTPException) -> BaseException:
    """The Omni client or server error for the framework's status (``exc``
    itself for a status that is neither)."""
    status = exc.status_code
    for category, wrapper in (("client", OmniClientError), ("server", OmniServerError)):
        if status in STATUS_RANGES[category]:
            detail = exc.detail if isinstance(exc.detail, str) else None
            return wrapper(
                detail or _DEFAULT_DETAIL[category],
                status_code=status,
                error_type=HTTP_STATUS_TYPES.get(status, DEFAULT_TYPE[category]),
            )
    return exc


def _allowed_methods(request: Request) -> str | None:
    """Every method some route accepts on this path, for a 405's ``Allow``.

    Starlette's own 405 names the methods of the first route that matched
    the path only; ``GET`` and ``DELETE`` on one path are two routes.
    """
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods)) or None


async def handle_http_exception(
    request: Request, exc: StarletteHTTPException
) -> Response:
    """The canonical response for a framework ``HTTPException``."""
    details = details_for_exception(
        as_semantic(exc),
        request_id=request_id_of(request),
        mode=error_mode(request.app),
    )
    allow = _allowed_methods(request) if details.status_code == 405 else None
    return http_error_response(details, allow=allow)
