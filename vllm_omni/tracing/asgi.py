"""The server span: a pure ASGI middleware, one span per HTTP request or
WebSocket session.

Installed just outside the error boundary, only when tracing is on; it
renders nothing (docs/observability/tracing.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import FastAPI
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vllm_omni.errors.http.request_ids import scope_request_id
from vllm_omni.tracing import attributes as a
from vllm_omni.tracing.provider import tracer
from vllm_omni.tracing.spans import end_server_span, start_server_span

__all__ = ["TracingMiddleware", "install_tracing"]

# Response starts that carry a status (an accepted WebSocket has none).
_STATUS_STARTS = frozenset({"http.response.start", "websocket.http.response.start"})


def _headers(scope: Scope) -> dict[str, str]:
    """The client's W3C trace headers (ASGI names them in lowercase)."""
    found: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        if name in (b"traceparent", b"tracestate"):
            found[name.decode()] = value.decode("latin-1")
    return found


class TracingMiddleware:
    """Pure ASGI middleware: the server span of each request."""

    def __init__(self, app: ASGIApp, excluded: frozenset[str] = frozenset()) -> None:
        self.app = app
        # Operational paths (``/health``, ``/metrics``): no span.
        self.excluded = excluded

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        active = tracer()
        if (
            scope["type"] not in ("http", "websocket")
            or active is None
            or scope.get("path") in self.excluded
        ):
            await self.app(scope, receive, send)
            return
        http = scope["type"] == "http"
        # A session's span is named so; its handshake is an HTTP GET.
        method = scope.get("method", "GET") if http else "WEBSOCKET"
        span, token, outcome = start_server_span(
            active,
            method,
            _headers(scope),
            {
                a.HTTP_METHOD: method if http else "GET",
                a.URL_PATH: scope.get("path", ""),
                a.URL_SCHEME: scope.get("scheme", "http"),
            },
        )
        status: int | None = None

        async def traced_send(message: Message) -> None:
            nonlocal status
            if message["type"] in _STATUS_STARTS:
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, traced_send)
        finally:
            attributes = {a.REQUEST_ID: scope_request_id(scope)}
            route = getattr(scope.get("route"), "path", None)
            if route is not None:
                span.update_name(f"{method} {route}")
                attributes[a.HTTP_ROUTE] = route
            end_server_span(span, token, outcome, status, attributes)


def install_tracing(app: FastAPI, excluded: Iterable[str] = ()) -> None:
    """Put the middleware just outside the error boundary, which
    ``install_error_handling`` keeps innermost (install that first): nothing
    between the two runs the route in another task, so the span sees the
    boundary's abort context, and the span covers every status the boundary
    renders. ``excluded``: paths without a span. Idempotent."""
    app.user_middleware[:] = [
        m for m in app.user_middleware if m.cls is not TracingMiddleware
    ]
    app.user_middleware.insert(
        max(len(app.user_middleware) - 1, 0),
        Middleware(TracingMiddleware, excluded=frozenset(excluded)),
    )
