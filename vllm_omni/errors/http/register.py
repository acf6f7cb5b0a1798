"""``install_error_handling``: the boundary and its handlers, in their layers.

Layers, outermost first, as Starlette builds them::

    ServerErrorMiddleware  ← handlers.safety_net: failures in other middleware
    user middleware …      ← Prometheus instrumentator, CORS, auth, …
    ErrorBoundary          ← always the last (innermost) user middleware
    ExceptionMiddleware    ← handlers.http_exceptions, handlers.validation
    router / routes        ← handlers.unmatched when no route matches

Why: Starlette sends a handler for ``Exception`` to ``ServerErrorMiddleware``,
outside every user middleware, so the instrumentator would count a 500
whatever the client got. Rendered inside it (the boundary, appended after
every ``add_middleware``, which inserts at the front; the framework handlers,
in ``ExceptionMiddleware``), each failure is recorded with the status the
client really received. docs/design.md §4.1.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware

from vllm_omni.errors.http.boundary import ErrorBoundary
from vllm_omni.errors.http.handlers.http_exceptions import handle_http_exception
from vllm_omni.errors.http.handlers.safety_net import handle_any_exception
from vllm_omni.errors.http.handlers.unmatched import not_found
from vllm_omni.errors.http.handlers.validation import handle_validation_error
from vllm_omni.errors.http.reporting import set_error_mode
from vllm_omni.errors.normalizer import Mode

__all__ = ["install_error_handling"]


def install_error_handling(
    app: FastAPI,
    *,
    mode: Mode = "strict",
    max_request_bytes: int | None = None,
    max_ws_message_bytes: int | None = None,
) -> None:
    """Install the boundary, the framework handlers and the outer safety net.

    Idempotent. ``mode="legacy"`` enables upstream's raw-exception fallbacks
    (``ValueError``/``TypeError``/``OverflowError`` → 400,
    ``NotImplementedError`` → 501), each hit counted and logged by raise site.
    ``max_request_bytes`` bounds every request body (413 past it),
    ``max_ws_message_bytes`` every WebSocket message (413 event, close 1009).
    """
    set_error_mode(app, mode)
    # Innermost user middleware: appended, where add_middleware never inserts.
    app.user_middleware[:] = [
        m for m in app.user_middleware if m.cls is not ErrorBoundary
    ]
    app.user_middleware.append(
        Middleware(
            ErrorBoundary,
            mode=mode,
            max_request_bytes=max_request_bytes,
            max_ws_message_bytes=max_ws_message_bytes,
        )
    )
    # Inside ExceptionMiddleware, so inside the instrumentator too.
    app.router.default = not_found
    app.add_exception_handler(StarletteHTTPException, handle_http_exception)
    app.add_exception_handler(RequestValidationError, handle_validation_error)
    # Starlette gives a handler for Exception to ServerErrorMiddleware.
    app.add_exception_handler(Exception, handle_any_exception)
